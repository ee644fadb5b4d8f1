"""python -m rlgates.inspect RUN: the same as `python -m rlgates inspect RUN`."""

import sys

from .cli import main

sys.exit(main())
