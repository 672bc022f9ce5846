"""``python -m sketchrec``: the umbrella command."""

import sys

from sketchrec.cli import sketchrec_main

sys.exit(sketchrec_main())
