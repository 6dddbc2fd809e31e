"""The command line's commands by group (core/__main__.py builds the parser from them and runs one)."""
