"""The `specdec` command line (installed as the import package `specdec_cli`)."""
