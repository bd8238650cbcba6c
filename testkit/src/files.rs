//! A staged tree of many small files, for checkpoint tests and the soak bench.

use std::path::Path;

/// Writes `n` JSON files `d<i % 10>/f<i>.json` under `staging`.
pub fn stage_files(staging: &Path, n: usize) {
    for i in 0..n {
        let d = staging.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.json")), format!("{{\"i\": {i}}}")).unwrap();
    }
}

/// How many entries the ten `d<k>` folders of a [`stage_files`] tree under `root` hold.
pub fn count_files(root: &Path) -> usize {
    (0..10)
        .map(|d| {
            std::fs::read_dir(root.join(format!("d{d}")))
                .map(|r| r.count())
                .unwrap_or(0)
        })
        .sum()
}
