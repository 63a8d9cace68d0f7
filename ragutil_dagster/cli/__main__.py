import sys

from ragutil_dagster.cli import main

sys.exit(main())
