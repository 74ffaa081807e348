"""`python -m tunelab` is the worker, as `python -m tunelab.worker` is."""

import sys

from tunelab.worker import main

sys.exit(main())
