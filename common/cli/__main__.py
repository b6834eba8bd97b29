"""``python -m common.cli ...`` is ``replog ...``."""

import os
import sys

from common.cli.main import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(main())
