//! A Bloom filter over the trace ids the writer has stored, so a request's brand-new
//! traces (nearly all of them under load) skip the `trace_index` lookup.
//!
//! It never answers "absent" for a stored trace id: every id in `trace_index` and in the
//! unmerged map is inserted (at start-up by a scan, then by the writer as it stores
//! batches). Deletions by retention leave stale bits: they only cost a lookup. When more
//! distinct ids were inserted than it was sized for, the writer rebuilds it from the ids
//! stored then, for twice as many (~10 bits per id, ~1% false positives at capacity): its
//! size follows the store, not every id ever seen, so at the size cap it stays small.

/// Bits per expected id.
const BITS_PER_ID: usize = 10;
/// Probes per id.
const PROBES: u64 = 7;
/// Smallest capacity, ids (80 KiB of bits).
pub(crate) const MIN_CAPACITY: usize = 64 * 1024;

/// The filter.
pub(crate) struct TraceBloom {
    bits: Vec<u64>,
    mask: u64,
    capacity: usize,
    inserted: usize,
}

fn hashes(t: &[u8; 16]) -> (u64, u64) {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&t[..8]);
    hi.copy_from_slice(&t[8..]);
    // splitmix64 finalizers: ids need not be random (tests use counters).
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(u64::from_le_bytes(lo) ^ mix(u64::from_le_bytes(hi)));
    let b = mix(a ^ u64::from_le_bytes(hi)) | 1;
    (a, b)
}

impl TraceBloom {
    /// An empty filter sized for `capacity` ids (at least [`MIN_CAPACITY`]).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(MIN_CAPACITY);
        let bits = (capacity * BITS_PER_ID).next_power_of_two();
        Self {
            bits: vec![0u64; bits / 64],
            mask: bits as u64 - 1,
            capacity,
            inserted: 0,
        }
    }

    /// False only when `t` was never inserted.
    pub(crate) fn may_contain(&self, t: &[u8; 16]) -> bool {
        let (a, b) = hashes(t);
        (0..PROBES).all(|i| {
            let bit = a.wrapping_add(i.wrapping_mul(b)) & self.mask;
            self.bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0
        })
    }

    /// Inserts `t`.
    pub(crate) fn insert(&mut self, t: &[u8; 16]) {
        let (a, b) = hashes(t);
        let mut new = false;
        for i in 0..PROBES {
            let bit = a.wrapping_add(i.wrapping_mul(b)) & self.mask;
            let w = &mut self.bits[(bit / 64) as usize];
            let m = 1 << (bit % 64);
            new |= *w & m == 0;
            *w |= m;
        }
        if new {
            self.inserted += 1;
        }
    }

    /// True when more ids went in than it was sized for.
    pub(crate) fn overfull(&self) -> bool {
        self.inserted > self.capacity
    }
}

/// A fast hasher for maps keyed by trace and span ids (random bytes from clients; the
/// maps live for one request or one merge window, so flooding is not a concern worth
/// SipHash's cost on the ingest path).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// `BuildHasher` for [`IdHasher`].
pub(crate) type IdBuild = std::hash::BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_ids_are_always_found_and_most_others_are_not() {
        let mut b = TraceBloom::with_capacity(10_000);
        for i in 0u64..60_000 {
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&i.to_le_bytes());
            b.insert(&t);
        }
        for i in 0u64..60_000 {
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&i.to_le_bytes());
            assert!(b.may_contain(&t));
        }
        let false_pos = (60_000u64..160_000)
            .filter(|i| {
                let mut t = [0u8; 16];
                t[..8].copy_from_slice(&i.to_le_bytes());
                b.may_contain(&t)
            })
            .count();
        assert!(false_pos < 3_000, "{false_pos} false positives in 100k");
        assert!(!b.overfull());
    }
}
