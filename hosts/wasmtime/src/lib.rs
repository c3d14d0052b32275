//! frugal in a wasmtime sandbox (skeleton; see issue 5).
