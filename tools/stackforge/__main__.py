import gc
import sys

from stackforge.cli.main import main

code = main()
# The process ends here. Every object it made is reclaimed with the process, so the collector's passes over
# all of them (the modules, the stack model's schemas) at interpreter exit only cost time: tens of ms on a
# short verb. Frozen objects are skipped by those passes; atexit handlers still run and streams are flushed.
gc.freeze()
sys.exit(code)
