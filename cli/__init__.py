"""mesh: the command-line client."""
