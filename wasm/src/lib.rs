//! frugal in the browser (skeleton; see issue 5).
