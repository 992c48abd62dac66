import sys

from stackforge.cli.main import main

sys.exit(main())
