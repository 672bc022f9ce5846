"""DP-SGD's options as frozen settings (--dp-epsilon, --dp-noise, --sgld-dp and the rest): which
privacy mode they ask for, whether they fit together, and the model's ``DPConfig`` they make."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from sketchrec.models.registry import DP_DEFAULTS
from sketchrec.privacy.mode import PrivacyMode


@dataclass(frozen=True)
class DPSettings:
    """DP-SGD's options. ``enabled`` when one of --dp-epsilon, --dp-noise, --sgld-dp is given; the
    unit and delta also account a pass of a private model resumed from a checkpoint."""

    epsilon: float | None = None
    noise: float | None = None
    sgld_temperature: float | None = None
    delta: float = DP_DEFAULTS["delta"]
    clip: float = DP_DEFAULTS["clip"]
    batch: int = DP_DEFAULTS["batch"]
    unit: str = "rating"
    user_cap: int | None = None
    rating_range: tuple[float, float] = (0.5, 5.0)
    budget: float | None = None
    model: str = "auto"     # --dp-model: the holdout protocol's private learner
    rank: int = 0           # --dp-rank: the joint mode's item factors

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DPSettings":
        return cls(args.dp_epsilon, args.dp_noise, args.sgld_dp, args.dp_delta, args.dp_clip,
                   args.dp_batch, args.dp_unit, args.dp_user_cap, tuple(args.dp_range),
                   args.budget_epsilon, args.dp_model, args.dp_rank)

    def joint(self, holdout: bool) -> bool:
        """Whether the run is the joint-DP mode: epochs (holdout) at a given finite epsilon, and
        asked for (--dp-model joint), or the user unit's default (auto)."""
        if self.model == "sgd" or not holdout or self.target is None:
            return False
        return self.model == "joint" or self.unit == "user"

    def problems(self, holdout: bool) -> list[str]:
        """Options that do not fit together (one line each)."""
        lines = []
        if self.model == "joint" and self.enabled and self.target is None:
            lines.append("the joint-DP mode is calibrated to a finite --dp-epsilon; give --dp-epsilon "
                         "E, or --dp-model sgd with --dp-noise / --sgld-dp")
        if (self.enabled and self.unit == "user" and not self.user_cap
                and self.mode(holdout) is PrivacyMode.DP_SGD_USER):
            lines.append("--dp-unit user with DP-SGD needs --dp-user-cap M (the ratings kept per "
                         "user); give it, or use the joint-DP mode (--holdout F --dp-epsilon E)")
        return lines

    def mode(self, holdout: bool, ldp: bool = False, sgld: float | None = None,
             clip_loss: float | None = None) -> PrivacyMode:
        """The privacy mode these options ask for (``privacy.mode.PrivacyMode``)."""
        user = self.unit == "user"
        if self.enabled and (self.joint(holdout) or self.model == "joint" and not holdout):
            return PrivacyMode.JOINT_USER if user else PrivacyMode.JOINT_RATING
        if self.sgld_temperature is not None:
            return PrivacyMode.SGLD_DP
        if self.enabled:
            return PrivacyMode.DP_SGD_USER if user else PrivacyMode.DP_SGD_RATING
        if ldp:
            return PrivacyMode.LDP
        if clip_loss is not None:
            return PrivacyMode.CLIP_LOSS
        return PrivacyMode.SGLD if sgld else PrivacyMode.NONE

    @property
    def enabled(self) -> bool:
        return any(x is not None for x in (self.epsilon, self.noise, self.sgld_temperature))

    @property
    def target(self) -> float | None:
        """The epsilon epoch training must calibrate to (None: the noise was given, or no noise)."""
        return None if self.epsilon is None or math.isinf(self.epsilon) else self.epsilon

    def config(self, *, stream: bool, depth: int, lr: float):
        """The model's ``DPConfig``. With --dp-epsilon and ``stream`` (one pass) the noise
        multiplier is calibrated here; for epoch training it is calibrated by
        ``train_private_epochs`` once the (capped) training set, hence q and the steps, are known."""
        from sketchrec.models.private.dp_sgd import DPConfig
        from sketchrec.privacy.budget import sgld_noise_multiplier, stream_noise_multiplier
        if self.unit == "user" and not self.user_cap:
            raise SystemExit("--dp-unit user needs --dp-user-cap M")
        factor = 1 if self.unit == "rating" else self.user_cap
        mode = "dp-sgd"
        if self.noise is not None:
            sigma = self.noise
        elif self.sgld_temperature is not None:  # the SGLD kernel's cell noise, as a multiplier
            sigma, mode = sgld_noise_multiplier(depth, self.sgld_temperature, lr, self.clip), "sgld-dp"
        elif math.isinf(self.epsilon) or not stream:
            sigma = 0.0
        else:
            sigma = stream_noise_multiplier(self.epsilon, self.delta, factor)
        return DPConfig(noise_multiplier=sigma, clip=self.clip, batch_size=self.batch, unit=self.unit,
                        user_cap=self.user_cap, rating_range=self.rating_range, mode=mode)
