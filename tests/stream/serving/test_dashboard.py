"""The live dashboard at /: its files are served from the package with nothing from a CDN, and a
real headless Chromium shows the figures of a learning service as /stats and /privacy give them.

The browser test needs Chromium (Debian package `chromium`; .ci/run installs it) and Playwright;
it skips, saying which, only when one of them cannot be found. It saves a screenshot to the
path in $SKETCHREC_DASHBOARD_PNG when set (docs/figures/dashboard.png was made that way)."""

import os
import re
import shutil
import threading
import time

import httpx
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.stream.serving.dashboard import ASSETS
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from conftest import http

ADMIN = "operator-token"
BUDGET = 8.0      # epsilon; at noise multiplier 3 five passes fit and the sixth is refused
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def private_service():
    # wrapped with its private fallback, as replay and consume serve a DP-SGD model (a small
    # window: the baseline is released, and the choice made, within the test's stream)
    model = DPSGDFallback(SketchMF(dim=8, capacity=500, seed=0,
                                   dp=DPConfig(noise_multiplier=3.0, batch_size=250)), width=256, window=500)
    monitor = PrivacyMonitor(window=1000, reservoir=500, probe_every=500, alert_kld=0.05, seed=0)
    return LearningService(Recommender(model, pair_capacity=50_000, seed=0, monitor=monitor))


def learn(service, stop, turn, passes=7, pause=0.15):
    """A stream replayed pass after pass, each accounted before it is learned, as `consume` does;
    it ends when the budget refuses a pass. ``turn()`` is waited on before each batch."""
    data = SyntheticStream(n_ratings=3000, n_users=200, n_items=150, seed=1).all()
    for _ in range(passes):
        if not service.begin_private_pass("rating", 1e-5, BUDGET):
            service.record_skipped({"privacy budget spent": len(data)})
            return
        for batch in data.batches(500):
            turn()
            if stop.is_set():
                return
            predictions = service.recommender.learn_many(batch.users, batch.items, batch.ratings)
            service.errors.add(predictions, batch.ratings)
            time.sleep(pause)
        service.record_skipped({"missing fields": 2})


class Learner(threading.Thread):
    """The learning thread, free-running unless paced: ``pace_by_polls()`` makes it take one batch
    per ``step()`` (the test steps it once per dashboard poll it sees, so however slow the machine,
    the page sees the service learn batch by batch, not only its end); ``run_free()`` ends that."""

    def __init__(self, service, stop):
        super().__init__(target=learn, args=(service, stop, self.turn), daemon=True)
        self.steps, self.paced, self.stop = threading.Semaphore(0), threading.Event(), stop

    def pace_by_polls(self):
        self.paced.set()

    def step(self):
        self.steps.release()

    def run_free(self):
        self.paced.clear()
        self.steps.release()

    def turn(self):
        while self.paced.is_set() and not self.stop.is_set() and not self.steps.acquire(timeout=0.1):
            pass


@pytest.fixture(scope="module")
def served():
    service, stop = private_service(), threading.Event()
    app = create_app(service, ADMIN)   # a DP service: access control and the release line are on
    server = ServerThread(app, "127.0.0.1", 0).start()
    learner = Learner(service, stop)   # started by the test
    yield f"http://127.0.0.1:{server.port}", service, learner
    stop.set()
    if learner.ident is not None:
        learner.join(timeout=10)
    server.stop()


def test_page_and_assets_come_from_the_package_without_a_cdn(served):
    base, _, _ = served
    with httpx.Client(base_url=base, timeout=10) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert sorted(linked) == sorted(f"dashboard/{name}" for name in ASSETS)
        for name in ASSETS:
            r = client.get(f"/dashboard/{name}")
            assert r.status_code == 200 and len(r.content) > 500
            assert "://" not in r.text or name.startswith("uPlot")   # no remote fetch of our own
        assert client.get("/dashboard/../http.py").status_code == 404
        assert client.get("/dashboard/http.py").status_code == 404
        assert "/" not in client.get("/openapi.json").json()["paths"]   # a view, not an API


def find_browser() -> str | None:
    named = os.environ.get("SKETCHREC_CHROMIUM")
    if named and os.path.exists(named):
        return named
    return next(filter(None, map(shutil.which, BROWSERS)), None)


@pytest.fixture(scope="module")
def browser():
    executable = find_browser()
    if executable is None:
        pytest.skip("no Chromium found (install the Debian package `chromium`, as .ci/run does, or set "
                    "$SKETCHREC_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                   "(pip install -e '.[test]')")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])  # CI runs as root
        yield chromium
        chromium.close()


def wait_until(page, predicate: str, timeout: float, each=None) -> None:
    """Poll `predicate` (a JavaScript expression or arrow function) until it is truthy, calling
    ``each()`` (if given) between tries.

    Not Playwright's wait_for_function: that evaluates its predicate with eval() inside the page,
    which the dashboard's Content-Security-Policy (script-src 'self') rightly forbids.
    page.evaluate runs through the DevTools protocol, outside the page's CSP."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(predicate):
        assert time.monotonic() < deadline, f"not true within {timeout} s: {predicate}"
        if each is not None:
            each()
        time.sleep(0.1)


def card(page, name: str) -> str:
    return page.get_attribute(f"#v-{name}", "data-value")


CHARTS = ("c-rmse", "c-kld", "c-eps", "c-rate", "c-skipped", "c-mem")


def drawn(page) -> dict:
    """Per chart: the count of points it holds (non-null, and for the skipped reasons non-zero)
    and the reason drawn over it ('' when none is shown)."""
    return page.evaluate("""(ids) => Object.fromEntries(ids.map((id) => {
        const data = window.dashboard.charts[id].data.slice(1).flat();
        const reason = document.getElementById("r-" + id);
        return [id, { points: data.filter((x) => x !== null && (id !== "c-skipped" || x > 0)).length,
                      reason: reason.hidden ? "" : reason.textContent }]; }))""", list(CHARTS))


def assert_no_blank_chart(page) -> dict:
    """Every chart holds values or says why it has none."""
    charts = drawn(page)
    for name, chart in charts.items():
        assert chart["points"] > 0 or chart["reason"], f"{name} is empty and says nothing: {charts}"
    return charts


def test_dashboard_shows_the_live_figures_of_a_learning_service(served, browser, tmp_path):
    base, service, learner = served
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base + "/#token=" + ADMIN)   # the operator: exact figures come from /admin/privacy
    wait_until(page, "window.dashboard.polls >= 1", timeout=60)
    assert "token" not in page.url      # taken out of the address bar
    # once the page watches, one batch per poll it makes: a slow machine still sees it learn
    learner.pace_by_polls()
    learner.start()
    seen = [page.evaluate("window.dashboard.polls")]

    def step_on_a_new_poll():
        polls = page.evaluate("window.dashboard.polls")
        if polls > seen[0]:
            seen[0] = polls
            learner.step()

    # the charts fill while the service learns: several points of RMSE, KLD, epsilon and rate
    wait_until(page, """() => {
        const c = window.dashboard && window.dashboard.charts, some = (id, k) =>
            c && c[id] && c[id].data[k].filter(x => x !== null && x > 0).length >= 2;
        return some("c-rmse", 1) && some("c-kld", 2) && some("c-eps", 1) && some("c-rate", 1)
            && some("c-mem", 1) && some("c-eps", 2) && some("c-kld", 3); }""", timeout=120,
               each=step_on_a_new_poll)
    learner.run_free()
    learner.join(timeout=60)
    assert not learner.is_alive() and service.budget_stopped     # learning ended: figures now still
    polls = page.evaluate("window.dashboard.polls")
    wait_until(page, f"window.dashboard.polls >= {polls + 2}", timeout=60)
    with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        admin = client.get("/admin/privacy").json()
        stats, privacy = admin["stats"], client.get("/privacy").json() | admin["monitor"]
    assert int(card(page, "learned")) == stats["ratings_learned"] > 0
    assert float(card(page, "rmse")) == stats["prequential_rmse"]
    assert float(card(page, "kld")) == privacy["kld"]
    assert float(card(page, "kldc")) == privacy["kld_cumulative"]
    assert float(card(page, "eps")) == privacy["epsilon"] <= BUDGET
    assert page.inner_text("#v-eps") == f"{round(privacy['epsilon'], 3):g} / 8"
    assert int(card(page, "mem")) == stats["model_bytes"]
    assert int(card(page, "skipped")) == sum(stats["skipped"].values()) > 0
    assert "privacy budget spent" in page.inner_text("#v-reasons")
    assert float(card(page, "rate")) == 0.0                       # nothing learned since the last poll
    assert "dp-sgd" in page.inner_text("#v-mode") and "budget spent" in page.inner_text("#v-mode")
    assert page.locator("#c-skipped .u-legend").inner_text().count("missing fields") == 1
    assert page.locator("canvas").count() == 6                    # every chart drew
    assert "stopped: privacy budget spent" in page.inner_text("#status")
    assert card(page, "answers") in ("baseline", "factors")        # which model answers, and why
    assert page.inner_text("#v-answers-why") == client_privacy(base)["serving"]
    assert float(card(page, "released")) == client_privacy(base)["released"]["private_mean"]
    charts = assert_no_blank_chart(page)
    assert all(charts[name]["points"] for name in CHARTS if name != "c-skipped")
    # the "try it" box shows what /recommend answers
    page.fill("#try-user", "7")
    page.fill("#try-k", "5")
    page.click("#try button")
    page.wait_for_selector("#try-out tr:nth-child(6)")
    expected = http.get(base + "/recommend", params={"user": "7", "k": 5},
                        headers={"Authorization": f"Bearer {ADMIN}"}).json()
    shown = page.locator("#try-out td:nth-child(2)").all_inner_texts()
    assert shown == [str(x["item"]) for x in expected["items"]]
    assert errors == []
    page.screenshot(path=os.environ.get("SKETCHREC_DASHBOARD_PNG") or tmp_path / "dashboard.png",
                    full_page=True)
    page.close()


def client_privacy(base: str) -> dict:
    return http.get(base + "/privacy", timeout=10).json()


def test_without_the_operator_token_a_dp_service_shows_only_its_release(served, browser):
    """The public view: the guarantee, the released (noised) figures and which model answers;
    every exact figure's card is n/a and its chart says it is operator state."""
    base, service, learner = served
    if learner.ident is None:   # run alone: learn first (the operator's test does, watching)
        learner.start()
    learner.join(timeout=60)
    page = browser.new_page()
    page.goto(base + "/")
    wait_until(page, "window.dashboard.polls >= 2", timeout=60)
    public = client_privacy(base)
    assert float(card(page, "eps")) == public["epsilon"] > 0     # the guarantee is public
    for name in ("learned", "rmse", "kld", "kldc", "mem", "skipped"):  # exact: operator state
        assert card(page, name) == ""
    # the released figures are the noised ones /privacy gives, and the model that answers
    assert public["released"]["noisy_ratings"] is not None
    assert float(card(page, "released")) == public["released"]["private_mean"]
    assert str(round(public["released"]["noisy_ratings"])) in page.inner_text("#v-released-n").replace(",", "")
    assert card(page, "answers") == ("baseline" if public["fallback"] else "factors")
    assert "versus_private_mean" not in public and "versus_private_mean" not in http.get(base + "/stats").json()
    charts = assert_no_blank_chart(page)
    for name in ("c-rmse", "c-kld", "c-rate", "c-skipped", "c-mem"):
        assert charts[name]["points"] == 0 and "operator state" in charts[name]["reason"]
    assert charts["c-eps"]["points"] > 0 and not charts["c-eps"]["reason"]
    assert "stopped: privacy budget spent" in page.inner_text("#status")
    page.close()


def test_missing_privacy_figures_show_as_na(served, browser):
    """The public /privacy fails: its figures show as n/a; what the operator's /admin/privacy and
    /stats give is still drawn."""
    base, service, _ = served
    page = browser.new_page()
    page.route(base + "/privacy", lambda route: route.fulfill(status=401, body='{"detail": "token"}'))
    page.goto(base + "/#token=" + ADMIN)
    wait_until(page, "window.dashboard.polls >= 2", timeout=60)
    assert card(page, "eps") == "" and page.inner_text("#v-eps") == "n/a / n/a"
    assert card(page, "kld") != ""                                    # the operator's monitor
    assert int(card(page, "mem")) == service.recommender.model.nbytes   # /stats still drawn
    page.close()


def test_replay_serve_shows_its_error_and_that_it_finished(browser, tmp_path):
    """`replay --serve`, non-private: the replay loop feeds the service's prequential error (the
    RMSE card and chart), the state says "finished" once the file ended, and the charts with
    nothing to draw (no epsilon without privacy, nothing set aside) say why."""
    from sketchrec.cli.config import ReplayConfig
    from sketchrec.cli.replay import build_parser, execute, prepare
    from sketchrec.cli.serving import start_server
    args = build_parser().parse_args(["--synthetic-ratings", "20000", "--synthetic-users", "500",
                                      "--synthetic-items", "300", "--quiet", "--workers", "1",
                                      "--serve", "127.0.0.1:0"])
    config = ReplayConfig.from_args(args, "replay")
    run = prepare(config)
    server = start_server(run.service, config.serving)
    try:
        result = execute(run)
        page = browser.new_page()
        page.goto(server.url + "/")
        wait_until(page, "window.dashboard.polls >= 3", timeout=60)
        assert float(card(page, "rmse")) == result["rmse"] == run.service.errors.rmse   # every rating
        assert int(card(page, "learned")) == result["ratings"] == 20000
        assert page.inner_text("#status").startswith("finished")
        charts = assert_no_blank_chart(page)
        assert charts["c-rmse"]["points"] >= 3 and charts["c-mem"]["points"] >= 3
        assert "non-private" in charts["c-eps"]["reason"]
        assert charts["c-skipped"]["reason"] == "no rating set aside so far"
        assert card(page, "answers") == "" and page.inner_text("#v-answers") == "the learner"
        page.close()
    finally:
        server.stop()


def test_a_consumer_waiting_for_its_broker_then_learning(browser):
    """A service fed as `consume` feeds it: "waiting for the broker" until a poll reaches one,
    then "learning" with its prequential error drawn; paused over HTTP, "paused"."""
    service = LearningService(Recommender(SketchMF(dim=8, capacity=1000, seed=0), pair_capacity=50_000,
                                          seed=0, monitor=PrivacyMonitor(window=500, reservoir=300,
                                                                          probe_every=200, seed=0)))
    service.health.watch_broker()
    service.health.polled(False, "connection refused")
    server = ServerThread(create_app(service, ADMIN), "127.0.0.1", 0).start()
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/")
        wait_until(page, "window.dashboard.polls >= 1", timeout=60)
        assert page.inner_text("#status").startswith("waiting for the broker")
        assert drawn(page)["c-rmse"]["reason"] == "no rating learned yet"
        service.health.polled(True)
        data = SyntheticStream(n_ratings=4000, n_users=200, n_items=150, seed=1).all()
        for batch in data.batches(500):   # as the consumer: learn, then record the served errors
            predictions = service.recommender.learn_many(batch.users, batch.items, batch.ratings)
            service.errors.add(predictions, batch.ratings)
            polls = page.evaluate("window.dashboard.polls")
            wait_until(page, f"window.dashboard.polls > {polls}", timeout=60)
        assert page.inner_text("#status").startswith("learning")
        assert float(card(page, "rmse")) == service.errors.rmse
        charts = assert_no_blank_chart(page)
        assert charts["c-rmse"]["points"] >= 2 and charts["c-kld"]["points"] >= 2
        http.post(f"http://127.0.0.1:{server.port}/pause", headers={"Authorization": f"Bearer {ADMIN}"})
        wait_until(page, "document.getElementById('status').textContent.startsWith('paused')", timeout=60)
        page.close()
    finally:
        server.stop()


def test_try_it_shows_titles_on_recommend_and_similar(browser):
    """With item titles (--items), the "try it" box shows each recommended and each similar item's
    title beside its id, as /recommend and /similar answer them (an item the file does not name
    has an empty title cell); without titles there is no title column."""
    from sketchrec.stream.titles import Titles
    service = LearningService(Recommender(SketchMF(dim=8, capacity=1000, seed=0), pair_capacity=50_000,
                                          seed=0))
    data = SyntheticStream(n_ratings=4000, n_users=200, n_items=150, seed=1).all()
    service.recommender.learn_many(data.users, data.items, data.ratings)
    server = ServerThread(create_app(service, ADMIN), "127.0.0.1", 0).start()
    base, auth = f"http://127.0.0.1:{server.port}", {"Authorization": f"Bearer {ADMIN}"}

    def shown(page, form: str, fields: dict, route: str, params: dict) -> tuple[list, dict]:
        for name, value in fields.items():
            page.fill(f"#{form}-{name}", value)
        page.evaluate("document.getElementById('try-out').replaceChildren()")   # the last answer gone
        page.click(f"#{form} button")
        page.wait_for_selector("#try-out tr:nth-child(6)")
        rows = page.locator("#try-out tr").all()
        return ([[c.inner_text() for c in row.locator("th, td").all()] for row in rows],
                http.get(base + route, params=params, headers=auth).json())

    try:
        page = browser.new_page()
        page.goto(base + "/#token=" + ADMIN)
        wait_until(page, "window.dashboard.polls >= 1", timeout=60)
        table, _ = shown(page, "try", {"user": "7", "k": "5"}, "/recommend", {"user": "7", "k": 5})
        assert table[0] == ["#", "item", "score"]    # no titles: no title column
        service.titles = Titles({str(i): f"Film {i}" for i in range(0, 150, 2)})
        server.stop()   # the app reads the titles when it is made
        server = ServerThread(create_app(service, ADMIN), "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{server.port}"
        page.goto(base + "/#token=" + ADMIN)
        wait_until(page, "window.dashboard.polls >= 1", timeout=60)
        table, expected = shown(page, "try", {"user": "7", "k": "5"}, "/recommend", {"user": "7", "k": 5})
        assert table[0] == ["#", "item", "title", "score"]
        assert [row[1:3] for row in table[1:]] == [[str(x["item"]), x.get("title", "")]
                                                    for x in expected["items"]]
        assert any(row[2] for row in table[1:]) and all(row[2] in ("", f"Film {row[1]}") for row in table[1:])
        table, expected = shown(page, "similar", {"item": "4", "k": "5"}, "/similar", {"item": "4", "k": 5})
        assert table[0] == ["#", "item", "title", "score"]
        assert [row[1:3] for row in table[1:]] == [[str(x["item"]), x.get("title", "")]
                                                    for x in expected["items"]]
        assert "items like 4 (Film 4)" in page.inner_text("#try-out")
        page.close()
    finally:
        server.stop()
