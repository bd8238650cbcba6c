//! Content validators of staged files, by extension (issue 4, Checkpoints; `docs/design.md`,
//! Checkpoints): JSON and `.ipynb` parse, CSV/TSV rows have the header's width (RFC 4180
//! quoting), HDF5 carries its format signature at offset 0, 512, 1024, 2048, ... (HDF5 spec,
//! "Format Signature"), and formats with content are never empty. They read from a file
//! already opened by descriptor, never by path.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;

use super::CheckpointError;

/// HDF5 format signature (HDF5 spec, "Format Signature"): at offset 0, 512, 1024, 2048, ...
pub const HDF5_SIGNATURE: [u8; 8] = [0x89, b'H', b'D', b'F', b'\r', b'\n', 0x1a, b'\n'];

/// Extensions whose files must not be empty (the format has content).
const NEEDS_CONTENT: &[&str] = &[
    "json", "ipynb", "csv", "tsv", "h5", "hdf5", "hdf", "he5", "npy", "npz", "parquet", "png",
    "jpg", "jpeg", "pdf", "pkl", "pickle", "pt", "pth",
];

/// Counts the fields of each CSV record (RFC 4180 quoting; newlines inside quotes belong to
/// the field). Answers the first record whose width differs from the header's as
/// `(record number from 1, its width, the header's width)`.
pub fn csv_width_mismatch(data: &[u8], sep: u8) -> Option<(usize, usize, usize)> {
    let mut widths = Vec::new();
    let (mut fields, mut in_quotes, mut any) = (1usize, false, false);
    let mut i = 0;
    while i < data.len() {
        let c = data[i];
        if in_quotes {
            if c == b'"' {
                if data.get(i + 1) == Some(&b'"') {
                    i += 1;
                } else {
                    in_quotes = false;
                }
            }
        } else if c == b'"' {
            in_quotes = true;
            any = true;
        } else if c == sep {
            fields += 1;
            any = true;
        } else if c == b'\n' {
            if any {
                widths.push(fields);
            }
            fields = 1;
            any = false;
        } else if c != b'\r' {
            any = true;
        }
        i += 1;
    }
    if any {
        widths.push(fields);
    }
    let header = *widths.first()?;
    widths
        .iter()
        .enumerate()
        .find(|(_, w)| **w != header)
        .map(|(row, w)| (row + 1, *w, header))
}

/// True when the HDF5 signature sits at offset 0, 512, 1024, 2048, ... of `data`.
pub fn has_hdf5_signature(data: &[u8]) -> bool {
    let mut off = 0usize;
    loop {
        match data.get(off..off + 8) {
            Some(s) if s == HDF5_SIGNATURE => return true,
            Some(_) => {}
            None => return false,
        }
        off = if off == 0 { 512 } else { off * 2 };
    }
}

/// The lower-case extension of `rel` (empty when it has none).
fn extension(rel: &Path) -> String {
    rel.extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

/// Validates one staged regular file of `len` bytes, read from `file` (opened by the
/// caller with `O_NOFOLLOW` and checked with `fstat`). `rel` names it in errors.
///
/// Errors: [`CheckpointError::Validation`] (422 at the edge) naming the file and the rule;
/// [`CheckpointError::Io`] when it cannot be read.
pub fn validate_content(rel: &Path, len: u64, file: &mut impl Read) -> Result<(), CheckpointError> {
    let ext = extension(rel);
    let invalid = |why: String| CheckpointError::Validation {
        path: rel.to_path_buf(),
        why,
    };
    if len == 0 {
        return if NEEDS_CONTENT.contains(&ext.as_str()) {
            Err(invalid(format!("empty .{ext} file")))
        } else {
            Ok(())
        };
    }
    if !matches!(
        ext.as_str(),
        "json" | "ipynb" | "csv" | "tsv" | "h5" | "hdf5" | "hdf" | "he5"
    ) {
        return Ok(());
    }
    let mut data = Vec::new();
    file.read_to_end(&mut data)
        .map_err(|e| CheckpointError::io(format!("reading {}", rel.display()), e))?;
    match ext.as_str() {
        "json" => {
            serde_json::from_slice::<serde::de::IgnoredAny>(&data)
                .map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        }
        "ipynb" => {
            let v: serde_json::Value = serde_json::from_slice(&data)
                .map_err(|e| invalid(format!("notebook is not valid JSON: {e}")))?;
            if !v.get("cells").is_some_and(|c| c.is_array()) {
                return Err(invalid("notebook has no \"cells\" list".into()));
            }
        }
        "csv" | "tsv" => {
            let sep = if ext == "csv" { b',' } else { b'\t' };
            if let Some((row, w, header)) = csv_width_mismatch(&data, sep) {
                return Err(invalid(format!(
                    "row {row} has {w} fields, the header has {header}"
                )));
            }
        }
        _ => {
            if !has_hdf5_signature(&data) {
                return Err(invalid(
                    "no HDF5 signature at offset 0, 512, 1024, ...".into(),
                ));
            }
        }
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

    fn check(rel: &str, data: &[u8]) -> Result<(), CheckpointError> {
        validate_content(Path::new(rel), data.len() as u64, &mut &data[..])
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
