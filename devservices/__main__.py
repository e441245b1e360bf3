"""``python -m devservices DATA_DIR``: start the servers, print their URLs as shell exports, run until Ctrl-C."""

import argparse
import signal
import sys
import time

from . import start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devservices", description=__doc__)
    parser.add_argument("data_dir")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    services = start(args.data_dir)
    print(f"# started in {time.monotonic() - t0:.2f}s; Ctrl-C to stop", file=sys.stderr)
    for key, value in services.env().items():
        print(f"export {key}='{value}'")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        services.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
