import sys

try:
    from .cli import main
except KeyboardInterrupt:     # Ctrl-C while the package imports: exit as an interrupt (130), without a traceback
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
