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

/// A notebook's top level as far as validation needs it: a `cells` list, its items
/// skipped unread.
#[derive(serde::Deserialize)]
struct Notebook {
    #[allow(dead_code)]
    cells: Vec<serde::de::IgnoredAny>,
}

/// Validates one staged regular file of `len` bytes, read from `file` (opened by the
/// caller with `O_NOFOLLOW` and checked with `fstat`). `rel` names it in errors. Reads the
/// file in [`READ_CHUNK`] pieces (JSON through a buffered reader, HDF5 only at its
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
        "json" => {
            let reader = BufReader::with_capacity(READ_CHUNK, file);
            serde_json::from_reader::<_, serde::de::IgnoredAny>(reader).map_err(|e| {
                if e.is_io() {
                    io(e.into())
                } else {
                    invalid(format!("not valid JSON: {e}"))
                }
            })?;
        }
        "ipynb" => {
            let reader = BufReader::with_capacity(READ_CHUNK, file);
            serde_json::from_reader::<_, Notebook>(reader).map_err(|e| {
                if e.is_io() {
                    io(e.into())
                } else if e.is_data() {
                    invalid("notebook has no \"cells\" list".into())
                } else {
                    invalid(format!("notebook is not valid JSON: {e}"))
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
        assert!(e.contains("no \"cells\" list"), "{e}");
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
