"""The process entry of ``stackforge`` (the installed script) and of ``python -m stackforge``.

A stackforge process pauses Python's cyclic garbage collector while it starts: importing the libraries and the
stack model, parsing stack files and validating them make hundreds of thousands of objects that live until the
process ends, and the collector's passes over them (one every 700 new objects, a full one every 100 passes) only
cost time. The verbs that read stacks and print (``QUICK_VERBS``) end with the collector still paused; every
other verb sets it going again, with what start-up made frozen out of its passes, before it starts its work
(``stackforge.cli.main.main``). At exit the objects left are frozen as well: the process ends with them, and the
interpreter's last passes over them would only cost time (atexit handlers still run, streams are flushed).
"""

import gc
import sys


def run() -> None:
    gc.disable()
    from stackforge.cli.main import main

    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
