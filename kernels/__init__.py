"""nkikit.library: the kernel library, one publishable package per kernel."""
