//! Fuzz target: the capped decompression path (`Content-Encoding` gzip, x-gzip, deflate
//! (zlib or raw), zstd and stacked codings). The first byte picks the header value, the
//! second the output cap (256 bytes .. 64 KiB); the rest is the body. The output must never
//! exceed the cap, and nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stallwatch_collector::decompress_body;

const ENCODINGS: [&str; 8] = [
    "gzip",
    "x-gzip",
    "deflate",
    "zstd",
    "gzip, gzip",
    "deflate, zstd",
    "zstd, gzip",
    "br",
];

fuzz_target!(|data: &[u8]| {
    let [sel, cap, body @ ..] = data else { return };
    let encoding = ENCODINGS[usize::from(*sel) % ENCODINGS.len()];
    let limit = (usize::from(*cap) + 1) * 256;
    match decompress_body(bytes::Bytes::copy_from_slice(body), encoding, limit) {
        Ok(out) => assert!(
            out.len() <= limit,
            "{encoding}: {} bytes out past the {limit}-byte cap",
            out.len()
        ),
        Err(msg) => assert!(!msg.is_empty(), "{encoding}: empty error message"),
    }
});
