"""The command line: one module per verb group, each a thin shell over a library function."""
