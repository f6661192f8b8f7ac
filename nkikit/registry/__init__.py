"""The Hub registry behind `nkikit.kernels`: manifests, builds, digests, cache, locks, trust.

Modules, in the order a kernel travels through them:
  manifest (kernel.toml) -> testrun (its tests) -> rewrite, probe, card, build (the HF-kernels
  layout) -> publish (one atomic version) ... resolve (version -> commit) -> download (HF cache)
  -> digests (verify) -> lockfile (pins) -> importer (verified import) -> runtime (functions,
  torch ops) -> module (KernelModule) -> pull. trust, names, errors, hubclient serve them all;
  cli and demo are the command line and the README demo.

Use `from nkikit import kernels` for the public API; `nkikit.registry.demo.sharing_demo` runs
the sharing demo.
"""
