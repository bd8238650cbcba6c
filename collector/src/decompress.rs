//! `Content-Encoding` / `grpc-encoding` decoding through a reader capped at the request
//! limit, so a decompression bomb stops at `max_request_bytes` of output without ever
//! holding more (docs/design.md "Back-pressure and limits": tower-http's layer is not enough).
//!
//! gzip and x-gzip decode every member (multi-member gzip); `deflate` is sniffed: a zlib
//! header (RFC 1950, what HTTP means) or raw deflate (RFC 1951, what some clients send);
//! zstd decodes every frame with the window capped at 8 MiB. Bytes after the end of the
//! compressed body that start no further gzip member or zstd frame are refused, saying how
//! many: deflate would drop them unread, gzip and zstd would call the stream corrupt.

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

/// The magic numbers a further member or frame starts with: gzip (RFC 1952 §2.3.1), and
/// zstd's frame and skippable frames (RFC 8878 §3.1.1, §3.1.2; little-endian, a
/// skippable frame's low nibble is free).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

fn starts_zstd_frame(b: &[u8]) -> bool {
    b.starts_with(&ZSTD_MAGIC)
        || (b.len() >= 4 && b[0] & 0xf0 == 0x50 && b[1..4] == [0x2a, 0x4d, 0x18])
}

/// Reads `r` to the end onto `out`, which stays at most `limit` bytes, charging the
/// in-flight budget as it grows.
fn read_capped(
    mut r: impl Read,
    coding: Coding,
    limit: usize,
    charge: &mut Charge,
    out: &mut Vec<u8>,
) -> Result<(), Refusal> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(()),
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
}

/// The refusal for `rest` bytes after the end of a compressed body that do not start
/// another member or frame: they would otherwise be dropped unread (deflate) or reported
/// as a corrupt stream.
fn trailing(coding: Coding, rest: &[u8], what: &str) -> Refusal {
    Refusal::BadRequest(format!(
        "Content-Encoding {}: {} bytes follow the end of the compressed body and are not {what}",
        coding.name(),
        rest.len()
    ))
}

/// Decodes one coding off `data`: every gzip member and zstd frame in turn, one zlib or
/// raw deflate stream; bytes after the last that start no further member or frame are
/// refused ([`trailing`]).
fn decode_one(
    data: &[u8],
    coding: Coding,
    limit: usize,
    charge: &mut Charge,
) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::new();
    match coding {
        Coding::Identity => out.extend_from_slice(data),
        Coding::Gzip => {
            let mut rest = data;
            loop {
                let mut d = flate2::bufread::GzDecoder::new(rest);
                read_capped(&mut d, coding, limit, charge, &mut out)?;
                rest = d.into_inner();
                if rest.is_empty() {
                    break;
                }
                if !rest.starts_with(&GZIP_MAGIC) {
                    return Err(trailing(coding, rest, "another gzip member"));
                }
            }
        }
        Coding::Deflate if looks_like_zlib(data) => {
            let mut d = flate2::bufread::ZlibDecoder::new(data);
            read_capped(&mut d, coding, limit, charge, &mut out)?;
            if !d.get_ref().is_empty() {
                return Err(trailing(coding, d.get_ref(), "part of the zlib stream"));
            }
        }
        Coding::Deflate => {
            let mut d = flate2::bufread::DeflateDecoder::new(data);
            read_capped(&mut d, coding, limit, charge, &mut out)?;
            if !d.get_ref().is_empty() {
                return Err(trailing(coding, d.get_ref(), "part of the deflate stream"));
            }
        }
        Coding::Zstd => {
            let mut rest = data;
            loop {
                let mut dec = zstd::stream::read::Decoder::with_buffer(rest)
                    .map_err(|e| {
                        Refusal::BadRequest(format!(
                            "Content-Encoding zstd: cannot start decoder: {e}"
                        ))
                    })?
                    .single_frame();
                dec.window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(|e| Refusal::BadRequest(format!("Content-Encoding zstd: {e}")))?;
                read_capped(&mut dec, coding, limit, charge, &mut out)?;
                rest = dec.finish();
                if rest.is_empty() {
                    break;
                }
                if !starts_zstd_frame(rest) {
                    return Err(trailing(coding, rest, "another zstd frame"));
                }
            }
        }
    }
    Ok(out)
}

/// Decodes `codings` (in the order they were applied) off `body`, never producing more
/// than `limit` bytes.
///
/// Errors: [`Refusal::TooLarge`] past the limit, [`Refusal::BadRequest`] for a corrupt or
/// truncated stream or bytes after its end that start no further gzip member or zstd
/// frame, [`Refusal::Busy`] when the in-flight budget is exhausted.
pub(crate) fn decompress(
    body: bytes::Bytes,
    codings: &[Coding],
    limit: usize,
    charge: &mut Charge,
) -> Result<bytes::Bytes, Refusal> {
    let mut cur = body;
    for &coding in codings.iter().rev() {
        if coding == Coding::Identity {
            continue;
        }
        cur = bytes::Bytes::from(decode_one(&cur, coding, limit, charge)?);
    }
    Ok(cur)
}

/// Decodes a `Content-Encoding` header value (e.g. `"gzip"`, `"deflate, zstd"`) off `body`
/// through the same capped decoder the receivers use, never producing more than
/// `limit_bytes` bytes of output. No in-flight budget applies here (for fuzzing, tests and
/// tools; the receivers go through the same decoder with their budget charge).
///
/// Errors: the message the receivers answer with: an unknown coding (HTTP 415), output
/// past `limit_bytes` (HTTP 413), a corrupt or truncated stream or bytes after its end
/// (HTTP 400).
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

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::encode_all(data, 3).unwrap()
    }

    #[test]
    fn every_zstd_frame_and_skippable_frame_is_read() {
        let mut body = zstd(b"hello ");
        // A skippable frame (magic 0x184D2A53, 3 bytes of user data) between the two.
        body.extend([0x53, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]);
        body.extend(zstd(b"world"));
        assert_eq!(
            &run(body, &[Coding::Zstd], 1024).unwrap()[..],
            b"hello world"
        );
    }

    #[test]
    fn bytes_after_the_compressed_body_are_refused_saying_how_many() {
        let zlib = |data: &[u8]| {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(data).unwrap();
            z.finish().unwrap()
        };
        let raw = |data: &[u8]| {
            let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
            d.write_all(data).unwrap();
            d.finish().unwrap()
        };
        let cases: [(Vec<u8>, Coding, &str); 4] = [
            (gz(b"body"), Coding::Gzip, "another gzip member"),
            (zlib(b"body"), Coding::Deflate, "part of the zlib stream"),
            (raw(b"body"), Coding::Deflate, "part of the deflate stream"),
            (zstd(b"body"), Coding::Zstd, "another zstd frame"),
        ];
        for (body, coding, what) in cases {
            // Whole: read; with junk after it: refused.
            assert_eq!(&run(body.clone(), &[coding], 1024).unwrap()[..], b"body");
            let mut junk = body.clone();
            junk.extend(b"junk!");
            match run(junk, &[coding], 1024) {
                Err(Refusal::BadRequest(m)) => assert_eq!(
                    m,
                    format!(
                        "Content-Encoding {}: 5 bytes follow the end of the compressed body \
                         and are not {what}",
                        coding.name()
                    )
                ),
                other => panic!("{coding:?}: want BadRequest, got {other:?}"),
            }
        }
        // A second member that is itself cut short is corrupt, not trailing.
        let mut cut = gz(b"one");
        let second = gz(b"two");
        cut.extend(&second[..second.len() - 4]);
        match run(cut, &[Coding::Gzip], 1024) {
            Err(Refusal::BadRequest(m)) => assert!(m.contains("corrupt or truncated"), "{m}"),
            other => panic!("want BadRequest, got {other:?}"),
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
