//! Whole-system tests of the `stallwatch` binary.
