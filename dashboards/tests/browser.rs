//! (browser test: below)
