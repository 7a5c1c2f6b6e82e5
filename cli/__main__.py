"""``python -m shoal.cli`` runs the ``shoal`` command."""

from shoal.cli.main import main

if __name__ == "__main__":
    main()
