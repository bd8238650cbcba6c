//! `Content-Encoding` / `grpc-encoding` decoding through a reader capped at the request
//! limit, so a decompression bomb stops at `max_request_bytes` of output without ever
//! holding more (docs/design.md "Back-pressure and limits": tower-http's layer is not enough).
//!
//! gzip and x-gzip decode every member (multi-member gzip); `deflate` is sniffed: a zlib
//! header (RFC 1950, what HTTP means) or raw deflate (RFC 1951, what some clients send);
//! zstd decodes every frame with the window capped at 8 MiB.

use std::io::Read;

use crate::ingest::{Charge, Refusal};

/// Largest zstd window accepted: 2^23 = 8 MiB (zstd levels 1–19 at default settings).
const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// Read step of the capped decoder, bytes.
const CHUNK_BYTES: usize = 64 * 1024;

/// A content coding we can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coding {
    /// `identity` (or no header).
    Identity,
    /// `gzip` / `x-gzip`.
    Gzip,
    /// `deflate` (zlib or raw).
    Deflate,
    /// `zstd`.
    Zstd,
}

impl Coding {
    /// Parses one coding name (case-insensitive); `None` for codings we do not implement.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "" | "identity" => Some(Coding::Identity),
            "gzip" | "x-gzip" => Some(Coding::Gzip),
            "deflate" => Some(Coding::Deflate),
            "zstd" => Some(Coding::Zstd),
            _ => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Zstd => "zstd",
        }
    }
}

/// Parses a `Content-Encoding` header value (a comma-separated list, applied in order).
/// Errors with the unknown coding's name (answered 415, never treated as identity).
pub(crate) fn parse_content_encoding(value: &str) -> Result<Vec<Coding>, String> {
    let mut out = Vec::new();
    for part in value.split(',') {
        match Coding::parse(part) {
            Some(Coding::Identity) => {}
            Some(c) => out.push(c),
            None => return Err(part.trim().to_string()),
        }
    }
    Ok(out)
}

fn looks_like_zlib(b: &[u8]) -> bool {
    b.len() >= 2
        && b[0] & 0x0f == 8
        && b[0] >> 4 <= 7
        && (u16::from(b[0]) << 8 | u16::from(b[1])).is_multiple_of(31)
}

/// Reads `r` to the end into a buffer of at most `limit` bytes, charging the in-flight
/// budget as it grows.
fn read_capped(
    mut r: impl Read,
    coding: Coding,
    limit: usize,
    charge: &mut Charge,
) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Refusal::BadRequest(format!(
                    "Content-Encoding {}: corrupt or truncated body: {e}",
                    coding.name()
                )))
            }
        };
        if out.len() + n > limit {
            return Err(Refusal::TooLarge(format!(
                "request body exceeds {limit} bytes after {} decompression",
                coding.name()
            )));
        }
        charge.grow(n)?;
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Decodes `codings` (in the order they were applied) off `body`, never producing more
/// than `limit` bytes.
///
/// Errors: [`Refusal::TooLarge`] past the limit, [`Refusal::BadRequest`] for a corrupt or
/// truncated stream, [`Refusal::Busy`] when the in-flight budget is exhausted.
pub(crate) fn decompress(
    body: bytes::Bytes,
    codings: &[Coding],
    limit: usize,
    charge: &mut Charge,
) -> Result<bytes::Bytes, Refusal> {
    let mut cur = body;
    for coding in codings.iter().rev() {
        let data: &[u8] = &cur;
        let out = match coding {
            Coding::Identity => continue,
            Coding::Gzip => read_capped(
                flate2::read::MultiGzDecoder::new(data),
                *coding,
                limit,
                charge,
            )?,
            Coding::Deflate if looks_like_zlib(data) => {
                read_capped(flate2::read::ZlibDecoder::new(data), *coding, limit, charge)?
            }
            Coding::Deflate => read_capped(
                flate2::read::DeflateDecoder::new(data),
                *coding,
                limit,
                charge,
            )?,
            Coding::Zstd => {
                let mut dec = zstd::stream::read::Decoder::with_buffer(data).map_err(|e| {
                    Refusal::BadRequest(format!("Content-Encoding zstd: cannot start decoder: {e}"))
                })?;
                dec.window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(|e| Refusal::BadRequest(format!("Content-Encoding zstd: {e}")))?;
                read_capped(dec, *coding, limit, charge)?
            }
        };
        cur = bytes::Bytes::from(out);
    }
    Ok(cur)
}

/// Decodes a `Content-Encoding` header value (e.g. `"gzip"`, `"deflate, zstd"`) off `body`
/// through the same capped decoder the receivers use, never producing more than
/// `limit_bytes` bytes of output. No in-flight budget applies here (for fuzzing, tests and
/// tools; the receivers go through the same decoder with their budget charge).
///
/// Errors: the message the receivers answer with: an unknown coding (HTTP 415), output
/// past `limit_bytes` (HTTP 413), a corrupt or truncated stream (HTTP 400).
pub fn decompress_body(
    body: bytes::Bytes,
    content_encoding: &str,
    limit_bytes: usize,
) -> Result<bytes::Bytes, String> {
    let codings = parse_content_encoding(content_encoding)
        .map_err(|c| format!("unsupported Content-Encoding {c}"))?;
    let budget = crate::ingest::Budget::new(usize::MAX, std::sync::Arc::default());
    let mut charge = budget.charge();
    decompress(body, &codings, limit_bytes, &mut charge).map_err(|r| r.message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::Budget;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn run(body: Vec<u8>, codings: &[Coding], limit: usize) -> Result<bytes::Bytes, Refusal> {
        let budget = Budget::new(1 << 30, std::sync::Arc::default());
        let mut charge = budget.charge();
        decompress(bytes::Bytes::from(body), codings, limit, &mut charge)
    }

    #[test]
    fn content_encoding_names() {
        assert_eq!(parse_content_encoding("GZIP").unwrap(), vec![Coding::Gzip]);
        assert_eq!(
            parse_content_encoding("x-gzip").unwrap(),
            vec![Coding::Gzip]
        );
        assert_eq!(parse_content_encoding("identity").unwrap(), vec![]);
        assert_eq!(
            parse_content_encoding("deflate, zstd").unwrap(),
            vec![Coding::Deflate, Coding::Zstd]
        );
        assert_eq!(parse_content_encoding("br").unwrap_err(), "br");
        assert_eq!(
            parse_content_encoding("gzip, compress").unwrap_err(),
            "compress"
        );
    }

    #[test]
    fn multi_member_gzip_decodes_every_member() {
        let mut body = gz(b"hello ");
        body.extend(gz(b"world"));
        assert_eq!(
            &run(body, &[Coding::Gzip], 1024).unwrap()[..],
            b"hello world"
        );
    }

    #[test]
    fn zlib_and_raw_deflate_are_both_accepted() {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(b"zlib body").unwrap();
        assert_eq!(
            &run(z.finish().unwrap(), &[Coding::Deflate], 1024).unwrap()[..],
            b"zlib body"
        );
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        d.write_all(b"raw body").unwrap();
        assert_eq!(
            &run(d.finish().unwrap(), &[Coding::Deflate], 1024).unwrap()[..],
            b"raw body"
        );
    }

    #[test]
    fn zstd_is_accepted() {
        let body = zstd::encode_all(&b"zstd body"[..], 3).unwrap();
        assert_eq!(&run(body, &[Coding::Zstd], 1024).unwrap()[..], b"zstd body");
    }

    #[test]
    fn bomb_stops_at_the_limit() {
        let body = gz(&vec![b'a'; 4 * 1024 * 1024]);
        assert!(body.len() < 64 * 1024);
        match run(body, &[Coding::Gzip], 1024 * 1024) {
            Err(Refusal::TooLarge(m)) => assert!(m.contains("1048576"), "{m}"),
            other => panic!("want TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn truncated_and_mislabelled_bodies_are_bad_requests() {
        let mut body = gz(b"some text that is long enough to matter");
        body.truncate(body.len() - 8);
        assert!(matches!(
            run(body, &[Coding::Gzip], 1024),
            Err(Refusal::BadRequest(_))
        ));
        assert!(matches!(
            run(b"{\"plain\": true}".to_vec(), &[Coding::Gzip], 1024),
            Err(Refusal::BadRequest(_))
        ));
        assert!(matches!(
            run(b"not zstd".to_vec(), &[Coding::Zstd], 1024),
            Err(Refusal::BadRequest(_))
        ));
    }
}
