"""The ``joynexus`` command line (typer + rich)."""
