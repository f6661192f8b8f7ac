"""The numpy simulator of the IR."""
