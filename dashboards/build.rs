//! Compresses the embedded web UI and the OpenAPI document with gzip at build time, so the
//! binary holds 56 KB of gzip instead of 192 KB of text (issue 16, binary size). The
//! dashboard serves the gzip bytes as they are to clients that accept gzip (every browser)
//! and inflates them for the rest (`src/routes/ui.rs`).

use std::io::Write;
use std::path::Path;

/// The files served, relative to the crate root; each becomes `$OUT_DIR/<file name>.gz`.
const FILES: &[&str] = &[
    "ui/index.html",
    "ui/app.js",
    "ui/app.css",
    "ui/forensics.js",
    "ui/traceview.js",
    "ui/readback.js",
    "ui/vendor/uPlot.iife.min.js",
    "ui/vendor/uPlot.min.css",
    "ui/vendor/uPlot.LICENSE",
    "src/openapi.json",
];

fn main() {
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    for file in FILES {
        println!("cargo:rerun-if-changed={file}");
        let text = std::fs::read(file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
        let mut gz = flate2::GzBuilder::new()
            // No name and a zero mtime: the same source gives the same bytes.
            .mtime(0)
            .write(Vec::new(), flate2::Compression::best());
        gz.write_all(&text).expect("writing to a Vec cannot fail");
        let gz = gz.finish().expect("writing to a Vec cannot fail");
        let name = Path::new(file)
            .file_name()
            .expect("every entry names a file");
        let mut dest = Path::new(&out).join(name);
        dest.as_mut_os_string().push(".gz");
        std::fs::write(&dest, gz).unwrap_or_else(|e| panic!("cannot write {dest:?}: {e}"));
    }
}
