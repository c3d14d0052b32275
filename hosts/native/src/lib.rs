//! frugal native host library.
