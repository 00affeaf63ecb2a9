"""``python -m kvtier`` is the ``kvtier`` console script."""
import sys

from kvtier.cli.main import main

sys.exit(main())
