"""The core layer: what a job is and the rules it follows, free of storage and of I/O.

The public value types (:mod:`._types`), errors (:mod:`._errors`) and what a handler
raises to steer its job (:mod:`._outcomes`), input validation (:mod:`._validate`),
serdes (:mod:`._serde`), retry policies (:mod:`._retry`), the rate limit setting
(:mod:`._limits`) and trace-context propagation (:mod:`._tracing`). With the Rust
extension ``trioqueue._core`` it is the bottom layer: it imports nothing else of
trioqueue (see the import contracts in ``pyproject.toml``).
"""
