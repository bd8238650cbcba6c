//! Content validators of staged files, by extension (issue 4, Checkpoints; `docs/design.md`,
//! Checkpoints): JSON and `.ipynb` parse, CSV/TSV rows have the header's width (RFC 4180
//! quoting), HDF5 carries its format signature at offset 0, 512, 1024, 2048, ... (HDF5 spec,
//! "Format Signature"), and formats with content are never empty. They read from a file
//! already opened by descriptor, never by path.

use std::ffi::OsStr;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::CheckpointError;

/// HDF5 format signature (HDF5 spec, "Format Signature"): at offset 0, 512, 1024, 2048, ...
pub const HDF5_SIGNATURE: [u8; 8] = [0x89, b'H', b'D', b'F', b'\r', b'\n', 0x1a, b'\n'];

/// Extensions whose files must not be empty (the format has content).
const NEEDS_CONTENT: &[&str] = &[
    "json", "ipynb", "csv", "tsv", "h5", "hdf5", "hdf", "he5", "npy", "npz", "parquet", "png",
    "jpg", "jpeg", "pdf", "pkl", "pickle", "pt", "pth",
];

/// Bytes read at a time while a staged file is validated (64 KiB): validation holds this
/// much of a file, never the whole of it (a multi-GiB HDF5 or CSV result is common).
const READ_CHUNK: usize = 64 * 1024;

/// Counts the fields of each CSV record as its bytes arrive (RFC 4180 quoting; newlines
/// inside quotes belong to the field), in constant memory.
#[derive(Debug)]
struct CsvWidths {
    sep: u8,
    fields: usize,
    in_quotes: bool,
    /// The previous byte closed a quoted part: a `"` now is an escaped quote (`""`).
    quote_pending: bool,
    any: bool,
    header: Option<usize>,
    records: usize,
}

impl CsvWidths {
    fn new(sep: u8) -> Self {
        Self {
            sep,
            fields: 1,
            in_quotes: false,
            quote_pending: false,
            any: false,
            header: None,
            records: 0,
        }
    }

    /// Feeds the next bytes; answers the first record whose width differs from the
    /// header's as `(record number from 1, its width, the header's width)`.
    fn feed(&mut self, data: &[u8]) -> Option<(usize, usize, usize)> {
        for &c in data {
            if self.quote_pending {
                self.quote_pending = false;
                if c == b'"' {
                    // `""` inside quotes: an escaped quote, still in the quoted part.
                    self.in_quotes = true;
                    continue;
                }
            }
            if self.in_quotes {
                if c == b'"' {
                    self.in_quotes = false;
                    self.quote_pending = true;
                }
            } else if c == b'"' {
                self.in_quotes = true;
                self.any = true;
            } else if c == self.sep {
                self.fields += 1;
                self.any = true;
            } else if c == b'\n' {
                if let Some(m) = self.end_record() {
                    return Some(m);
                }
            } else if c != b'\r' {
                self.any = true;
            }
        }
        None
    }

    /// The end of input: the last record when it has no newline.
    fn finish(&mut self) -> Option<(usize, usize, usize)> {
        self.end_record()
    }

    /// True when the input ended inside a quoted field (a truncated file).
    fn ends_in_quotes(&self) -> bool {
        self.in_quotes
    }

    fn end_record(&mut self) -> Option<(usize, usize, usize)> {
        let (width, any) = (self.fields, self.any);
        self.fields = 1;
        self.any = false;
        if !any {
            return None;
        }
        self.records += 1;
        match self.header {
            None => {
                self.header = Some(width);
                None
            }
            Some(h) if h != width => Some((self.records, width, h)),
            Some(_) => None,
        }
    }
}

/// Counts the fields of each CSV record (RFC 4180 quoting; newlines inside quotes belong to
/// the field). Answers the first record whose width differs from the header's as
/// `(record number from 1, its width, the header's width)`.
pub fn csv_width_mismatch(data: &[u8], sep: u8) -> Option<(usize, usize, usize)> {
    let mut w = CsvWidths::new(sep);
    w.feed(data).or_else(|| w.finish())
}

/// True when the HDF5 signature sits at offset 0, 512, 1024, 2048, ... of `data`.
pub fn has_hdf5_signature(data: &[u8]) -> bool {
    hdf5_signature_in(&mut std::io::Cursor::new(data), data.len() as u64).unwrap_or(false)
}

/// True when the HDF5 signature sits at offset 0, 512, 1024, 2048, ... of a file of `len`
/// bytes: reads 8 bytes at each of those offsets (about 30 reads for a 1 TiB file).
fn hdf5_signature_in(file: &mut (impl Read + Seek), len: u64) -> std::io::Result<bool> {
    let mut off = 0u64;
    while off.saturating_add(8) <= len {
        file.seek(SeekFrom::Start(off))?;
        let mut sig = [0u8; 8];
        file.read_exact(&mut sig)?;
        if sig == HDF5_SIGNATURE {
            return Ok(true);
        }
        off = if off == 0 { 512 } else { off * 2 };
    }
    Ok(false)
}

/// The lower-case extension of `rel` (empty when it has none).
fn extension(rel: &Path) -> String {
    rel.extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

/// A reader that fails with `InvalidData` at the first byte sequence that is not UTF-8:
/// JSON text is UTF-8 (RFC 8259, section 8.1), but skipping a string unread
/// (`IgnoredAny`) does not check it.
struct Utf8Checked<R> {
    inner: R,
    /// The bytes of a sequence cut by the end of the last read (at most 3).
    pending: Vec<u8>,
}

impl<R: Read> Read for Utf8Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text");
        if n == 0 {
            return if self.pending.is_empty() {
                Ok(0)
            } else {
                Err(bad())
            };
        }
        let mut joined = std::mem::take(&mut self.pending);
        joined.extend_from_slice(&buf[..n]);
        match std::str::from_utf8(&joined) {
            Ok(_) => {}
            Err(e) if e.error_len().is_none() => {
                self.pending = joined[e.valid_up_to()..].to_vec();
            }
            Err(_) => return Err(bad()),
        }
        Ok(n)
    }
}

/// A notebook's top level as far as validation needs it: a `cells` list, its items
/// skipped unread.
#[derive(serde::Deserialize)]
struct Notebook {
    #[allow(dead_code)]
    cells: Vec<serde::de::IgnoredAny>,
}

/// Validates one staged regular file of `len` bytes, read from `file` (opened by the
/// caller with `O_NOFOLLOW` and checked with `fstat`). `rel` names it in errors. Reads the
/// file in 64 KiB pieces (JSON through a buffered reader, HDF5 only at its
/// signature offsets), so a file of any size is validated in constant memory.
///
/// Errors: [`CheckpointError::Validation`] (422 at the edge) naming the file and the rule;
/// [`CheckpointError::Io`] when it cannot be read.
pub fn validate_content(
    rel: &Path,
    len: u64,
    file: &mut (impl Read + Seek),
) -> Result<(), CheckpointError> {
    let ext = extension(rel);
    let invalid = |why: String| CheckpointError::Validation {
        path: rel.to_path_buf(),
        why,
    };
    let io = |e: std::io::Error| CheckpointError::io(format!("reading {}", rel.display()), e);
    if len == 0 {
        return if NEEDS_CONTENT.contains(&ext.as_str()) {
            Err(invalid(format!("empty .{ext} file")))
        } else {
            Ok(())
        };
    }
    match ext.as_str() {
        "json" | "ipynb" => {
            let reader = BufReader::with_capacity(
                READ_CHUNK,
                Utf8Checked {
                    inner: file,
                    pending: Vec::new(),
                },
            );
            let parsed = if ext == "json" {
                serde_json::from_reader::<_, serde::de::IgnoredAny>(reader).map(drop)
            } else {
                serde_json::from_reader::<_, Notebook>(reader).map(drop)
            };
            let what = if ext == "json" {
                "not valid JSON"
            } else {
                "notebook is not valid JSON"
            };
            parsed.map_err(|e| {
                let text = e.to_string();
                if e.is_io() {
                    let e = std::io::Error::from(e);
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        invalid(format!("{what}: {e}"))
                    } else {
                        io(e)
                    }
                } else if e.is_data() && text.starts_with("missing field `cells`") {
                    invalid("notebook has no \"cells\" list".into())
                } else if e.is_data() && text.starts_with("invalid type") {
                    invalid(format!("notebook \"cells\" is not a list: {text}"))
                } else if e.is_data() {
                    invalid(format!("not a notebook: {text}"))
                } else {
                    invalid(format!("{what}: {text}"))
                }
            })?;
        }
        "csv" | "tsv" => {
            let mut widths = CsvWidths::new(if ext == "csv" { b',' } else { b'\t' });
            let mut buf = vec![0u8; READ_CHUNK];
            let mismatch = loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break widths.finish(),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io(e)),
                };
                if let Some(m) = widths.feed(&buf[..n]) {
                    break Some(m);
                }
            };
            if let Some((row, w, header)) = mismatch {
                return Err(invalid(format!(
                    "row {row} has {w} fields, the header has {header}"
                )));
            }
            if widths.ends_in_quotes() {
                return Err(invalid(
                    "a quoted field is still open at the end of the file (truncated?)".into(),
                ));
            }
        }
        "h5" | "hdf5" | "hdf" | "he5" if !hdf5_signature_in(file, len).map_err(io)? => {
            return Err(invalid(
                "no HDF5 signature at offset 0, 512, 1024, ...".into(),
            ));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_widths_with_quotes_and_newlines() {
        assert_eq!(csv_width_mismatch(b"a,b\n1,2\n\"x,\ny\",3\n", b','), None);
        assert_eq!(csv_width_mismatch(b"a,b\n1,2,3\n", b','), Some((2, 3, 2)));
        assert_eq!(csv_width_mismatch(b"a,b\r\n1,2\r\n", b','), None);
    }

    #[test]
    fn hdf5_signature_at_power_of_two_offsets() {
        let mut d = vec![0u8; 2048 + 8];
        assert!(!has_hdf5_signature(&d));
        d[1024..1032].copy_from_slice(&HDF5_SIGNATURE);
        assert!(has_hdf5_signature(&d));
        let mut e = vec![0u8; 800];
        e[300..308].copy_from_slice(&HDF5_SIGNATURE);
        assert!(!has_hdf5_signature(&e), "300 is not a valid offset");
    }

    /// The streaming count agrees with itself however the bytes are cut: quotes, escaped
    /// quotes and CRLF split across reads.
    #[test]
    fn csv_widths_do_not_depend_on_where_reads_end() {
        let data: &[u8] = b"a,\"b\"\"c\",d\r\n1,\"x,\ny\",3\r\n\"\"\"\",,\n4,5\n";
        let whole = csv_width_mismatch(data, b',');
        assert_eq!(whole, Some((4, 2, 3)));
        for cut in 0..data.len() {
            let mut w = CsvWidths::new(b',');
            let got = w
                .feed(&data[..cut])
                .or_else(|| w.feed(&data[cut..]))
                .or_else(|| w.finish());
            assert_eq!(got, whole, "cut at {cut}");
        }
    }

    /// Files larger than a read: a CSV whose bad row comes after many reads, and a sparse
    /// HDF5 file of 3 GiB whose signature is at 1 GiB (read at its offsets only).
    #[test]
    fn large_files_are_validated_piece_by_piece() {
        let mut csv = b"a,b\n".to_vec();
        while csv.len() < 5 * READ_CHUNK {
            csv.extend_from_slice(b"\"1,\n\",2\n");
        }
        assert!(check("big.csv", &csv).is_ok());
        csv.extend_from_slice(b"3\n");
        let e = check("big.csv", &csv).unwrap_err().to_string();
        assert!(e.contains("has 1 fields, the header has 2"), "{e}");
        for open in [&b"a,b\n1,\"2\n"[..], &b"a,b\n1,\"2\n3,4\n5,6\n"[..]] {
            let e = check("open.csv", open).unwrap_err().to_string();
            assert!(e.contains("still open at the end"), "{e}");
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.h5");
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len(3 << 30).unwrap();
        f.seek(SeekFrom::Start(1 << 30)).unwrap();
        std::io::Write::write_all(&mut f, &HDF5_SIGNATURE).unwrap();
        drop(f);
        let mut f = std::fs::File::open(&path).unwrap();
        assert!(validate_content(Path::new("results.h5"), 3 << 30, &mut f).is_ok());
        let other = dir.path().join("empty-sig.h5");
        std::fs::File::create(&other)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let mut f = std::fs::File::open(&other).unwrap();
        let e = validate_content(Path::new("empty-sig.h5"), 1 << 30, &mut f)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no HDF5 signature"), "{e}");
    }

    #[test]
    fn json_and_notebooks_are_read_as_streams() {
        let mut big = b"{\"a\": [".to_vec();
        while big.len() < 3 * READ_CHUNK {
            big.extend_from_slice(b"\"xxxxxxxx\", ");
        }
        big.extend_from_slice(b"1]}");
        assert!(check("big.json", &big).is_ok());
        big.push(b'x');
        let e = check("big.json", &big).unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        let e = check("n.ipynb", br#"{"cells": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"cells\" is not a list"), "{e}");
        let e = check("n.ipynb", br#"{"metadata": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no \"cells\" list"), "{e}");
        let e = check("n.ipynb", br#"{"cells": [], "cells": []}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate field"), "{e}");
        // Text that is not UTF-8 is not JSON, even inside a string skipped unread; a
        // sequence cut by a read boundary is fine.
        for (name, data) in [
            ("a.json", &b"{\"a\": \"\xff\"}"[..]),
            ("n.ipynb", &b"{\"cells\": [\"\xc3\"]}"[..]),
        ] {
            let e = check(name, data).unwrap_err().to_string();
            assert!(e.contains("not UTF-8"), "{name}: {e}");
        }
        let mut wide = b"{\"a\": \"".to_vec();
        while wide.len() < 3 * READ_CHUNK {
            wide.extend_from_slice("é€😀".as_bytes());
        }
        wide.extend_from_slice(b"\"}");
        assert!(check("wide.json", &wide).is_ok());
        let e = check("n.ipynb", br#"{"cells": [1, 2"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("notebook is not valid JSON"), "{e}");
    }

    fn check(rel: &str, data: &[u8]) -> Result<(), CheckpointError> {
        validate_content(
            Path::new(rel),
            data.len() as u64,
            &mut std::io::Cursor::new(data),
        )
    }

    #[test]
    fn empty_files_only_where_the_format_has_no_content() {
        assert!(check("pkg/__init__.py", b"").is_ok());
        assert!(matches!(
            check("a.json", b""),
            Err(CheckpointError::Validation { .. })
        ));
        assert!(check("a.json", b"{\"a\": [1,").is_err());
        assert!(check("n.ipynb", br#"{"cells": [], "metadata": {}}"#).is_ok());
        assert!(check("n.ipynb", br#"{"metadata": {}}"#).is_err());
    }
}
