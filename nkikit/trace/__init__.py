"""The dialect-neutral tracer: the kernel under construction (``builder``), index expressions
(``index``), the emit layer (``instructions``) and the jit machinery with its specialization
cache (``jit``).  Each dialect's proxies and argument parsing live in its own package
(``nkikit.language``/``nkikit.isa`` for NKI Beta 1, ``nkikit.nki`` for NKI 0.x)."""
