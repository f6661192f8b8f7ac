"""The tracer: proxies, index expressions, loop capture and the specialization cache."""
