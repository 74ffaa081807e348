"""The `tunelab` command of the installed package (`pip install .`).

It runs the Rust command line in this process, through the extension module:
`tunelab._native.cli_main` calls `tunelab::cli::main`, the function the
standalone binary's `main` calls, with the GIL released. The command writes to
the same file descriptors and returns the same exit code as the binary, and
this process exits with it. Ctrl-C: Python would turn SIGINT into
KeyboardInterrupt, which Rust code never sees; the default action is restored
first, so Ctrl-C ends `validate` or `plan` at once as it ends the binary, and
`tunelab run` installs its own handler as the binary does (finish the job in
flight, exit 130).
"""

import signal
import sys
from typing import NoReturn


def main() -> NoReturn:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from tunelab import _native

    sys.exit(_native.cli_main(sys.argv))


if __name__ == "__main__":
    main()
