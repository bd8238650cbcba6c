//! A span's attributes kept in their stored encoding from the moment they are decoded
//! ([`EncodedAttributes`]), and the hand-written postcard writer and reader of attribute
//! values that storage's span bodies use too (issue 16).
//!
//! The bytes are exactly those `postcard::to_extend` writes for a `Vec<KeyValue>` without
//! its leading length (postcard's wire format specification, "Serde Data Model Types"):
//! each `KeyValue` as its key (a varint length, then the UTF-8 bytes) and its value, an
//! [`AnyValue`](super::AnyValue) written as the varint of its variant's index in declaration
//! order (0 `Empty`, 1 `String`, 2 `Bool`, 3 `Int`, 4 `Double`, 5 `Bytes`, 6 `Array`,
//! 7 `KvList`) then its content: a string or bytes as a varint length and the bytes, a bool
//! as one byte, an `i64` zigzag-encoded as a varint, an `f64` as its 8 little-endian bytes,
//! a list as a varint count and its items. Storage's tests hold this writer to postcard.
//!
//! Why: decoding each attribute into a [`KeyValueRef`], keeping a vector of them per span,
//! then reading them again to write the stored body, and dropping the vector value by
//! value, cost more than writing the stored bytes once while the attribute is read.

use std::fmt;

use serde::ser::{Serialize, SerializeSeq, Serializer};

use super::{AnyValueRef, KeyValue, KeyValueRef, LOGFIRE_SPAN_TYPE};

/// The attribute keys the ingest path looks up in every span
/// ([`EncodedAttributes::get`], [`EncodedAttributes::looked_up`]): the Logfire
/// pending-span mark, and the keys storage indexes as terms. `push` notes where the first
/// attribute of each is, so they are read without a scan. Their lengths differ (what
/// the lookup relies on).
pub const LOOKED_UP_KEYS: [&str; 6] = [
    LOGFIRE_SPAN_TYPE,
    "error.type",
    "process.pid",
    "stallwatch.runner.id",
    "gen_ai.tool.name",
    "service.name",
];

/// The position of `key` in [`LOOKED_UP_KEYS`]. Called for every attribute of every span:
/// keys are told apart by length first, then compared as fixed-size arrays (a call to
/// `memcmp` per 16-byte key was 2% of a trace export's CPU).
#[inline(always)]
fn looked_up_index(key: &[u8]) -> Option<usize> {
    /// `key == k`, with `k`'s length known at compile time.
    #[inline(always)]
    fn is<const N: usize>(key: &[u8], k: &[u8; N]) -> bool {
        <&[u8; N]>::try_from(key).is_ok_and(|a| a == k)
    }
    let (i, hit) = match key.len() {
        17 => (0, is(key, b"logfire.span_type")),
        10 => (1, is(key, b"error.type")),
        11 => (2, is(key, b"process.pid")),
        20 => (3, is(key, b"stallwatch.runner.id")),
        16 => (4, is(key, b"gen_ai.tool.name")),
        12 => (5, is(key, b"service.name")),
        _ => return None,
    };
    hit.then_some(i)
}

/// An attribute value of a scalar kind: what an SDK writes for nearly every attribute, and
/// what the decoder's short path reads. Copied freely, dropped for nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar<'a> {
    /// `stringValue`.
    String(&'a str),
    /// `boolValue`.
    Bool(bool),
    /// `intValue`.
    Int(i64),
    /// `doubleValue`.
    Double(f64),
    /// `bytesValue`.
    Bytes(&'a [u8]),
}

impl<'a> From<Scalar<'a>> for AnyValueRef<'a> {
    fn from(v: Scalar<'a>) -> Self {
        match v {
            Scalar::String(s) => AnyValueRef::String(s),
            Scalar::Bool(b) => AnyValueRef::Bool(b),
            Scalar::Int(i) => AnyValueRef::Int(i),
            Scalar::Double(d) => AnyValueRef::Double(d),
            Scalar::Bytes(b) => AnyValueRef::Bytes(b),
        }
    }
}

/// Appends a [`Scalar`] as [`write_value`] writes the same [`AnyValueRef`].
#[inline(always)]
pub fn write_scalar(out: &mut Vec<u8>, v: Scalar<'_>) {
    match v {
        Scalar::String(s) => {
            out.push(1);
            write_bytes(out, s.as_bytes());
        }
        Scalar::Bool(b) => {
            out.push(2);
            out.push(u8::from(b));
        }
        Scalar::Int(i) => {
            out.push(3);
            write_signed(out, i);
        }
        Scalar::Double(d) => {
            out.push(4);
            out.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        Scalar::Bytes(b) => {
            out.push(5);
            write_bytes(out, b);
        }
    }
}

/// Appends an unsigned LEB128 varint (postcard's `u16` … `u64` and lengths).
#[inline]
pub fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a zigzag-encoded varint (postcard's `i16` … `i64`; an `i32` and the same value
/// as `i64` encode alike).
#[inline]
pub fn write_signed(out: &mut Vec<u8>, v: i64) {
    write_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Appends a length-prefixed byte slice (postcard's `&[u8]`, `Vec<u8>` and, with UTF-8
/// bytes, `&str`).
#[inline]
pub fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends a list of attributes: their count, then each key and value.
pub fn write_key_values(out: &mut Vec<u8>, kvs: &[KeyValueRef<'_>]) {
    write_varint(out, kvs.len() as u64);
    for kv in kvs {
        write_bytes(out, kv.key.as_bytes());
        write_value(out, &kv.value);
    }
}

/// Appends an [`AnyValueRef`]: its variant's index in declaration order, then its content.
/// Inlined for the scalar kinds, so a caller that built the value knows which it wrote;
/// lists are written out of line.
#[inline(always)]
pub fn write_value(out: &mut Vec<u8>, v: &AnyValueRef<'_>) {
    match v {
        AnyValueRef::Empty => out.push(0),
        AnyValueRef::String(s) => {
            out.push(1);
            write_bytes(out, s.as_bytes());
        }
        AnyValueRef::Bool(b) => {
            out.push(2);
            out.push(u8::from(*b));
        }
        AnyValueRef::Int(i) => {
            out.push(3);
            write_signed(out, *i);
        }
        AnyValueRef::Double(d) => {
            out.push(4);
            out.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        AnyValueRef::Bytes(b) => {
            out.push(5);
            write_bytes(out, b);
        }
        AnyValueRef::Array(_) | AnyValueRef::KvList(_) => write_list_value(out, v),
    }
}

/// [`write_value`] of an `Array` or a `KvList` (nothing for another kind).
#[inline(never)]
fn write_list_value(out: &mut Vec<u8>, v: &AnyValueRef<'_>) {
    match v {
        AnyValueRef::Array(items) => {
            out.push(6);
            write_varint(out, items.len() as u64);
            for item in items {
                write_value(out, item);
            }
        }
        AnyValueRef::KvList(kvs) => {
            out.push(7);
            write_key_values(out, kvs);
        }
        _ => {}
    }
}

/// A span's attributes in their stored encoding (see the module doc): the bytes postcard
/// writes for the list after its count, and the count. Built by [`push`](Self::push) as
/// the decoder reads each attribute; the stored body then copies the bytes as they are.
///
/// Two lists are equal when their bytes are: the same attributes in the same order (a
/// `NaN` double equals itself here, where [`AnyValueRef`]'s `==` says it does not).
#[derive(Clone, Default, PartialEq)]
pub struct EncodedAttributes {
    len: usize,
    /// For each of the [`LOOKED_UP_KEYS`], where the value of its first attribute starts
    /// in `bytes` (after its key, so never 0); 0 when no attribute has that key. (`u32`:
    /// this sits in every span in flight.)
    first: [u32; LOOKED_UP_KEYS.len()],
    /// Set when a looked-up value started past `u32::MAX` bytes and is not in `first`:
    /// lookups then scan.
    unrecorded: bool,
    bytes: Vec<u8>,
}

impl EncodedAttributes {
    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is no attribute.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room for attribute bytes, bytes.
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Makes room for at least `more` more bytes of attributes.
    pub fn reserve(&mut self, more: usize) {
        self.bytes.reserve(more);
    }

    /// Appends the attribute `key` = `value`.
    #[inline]
    pub fn push(&mut self, key: &str, value: &AnyValueRef<'_>) {
        self.push_key(key);
        write_value(&mut self.bytes, value);
    }

    /// Appends the attribute `key` = `value`, of a scalar kind.
    #[inline(always)]
    pub fn push_scalar(&mut self, key: &str, value: Scalar<'_>) {
        self.push_key(key);
        write_scalar(&mut self.bytes, value);
    }

    /// Appends a key, noting where its value starts when it is looked up; the value is
    /// written next.
    #[inline(always)]
    fn push_key(&mut self, key: &str) {
        write_bytes(&mut self.bytes, key.as_bytes());
        if let Some(i) = looked_up_index(key.as_bytes()) {
            if self.first[i] == 0 {
                match u32::try_from(self.bytes.len()) {
                    Ok(at) => self.first[i] = at,
                    Err(_) => self.unrecorded = true,
                }
            }
        }
        self.len += 1;
    }

    /// The encoded attributes, without their count: what follows the count in a stored
    /// body.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Appends the list as postcard writes a `Vec<KeyValue>`: the count, then the bytes.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        write_varint(out, self.len as u64);
        out.extend_from_slice(&self.bytes);
    }

    /// The attributes, read back, in order; strings and bytes borrow from `self`.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.items())
    }

    /// The first attribute of each of the [`LOOKED_UP_KEYS`] present, in attribute
    /// order, as (key, value); read without a scan.
    pub fn looked_up(&self) -> impl Iterator<Item = (&'static str, AnyValueRef<'_>)> + '_ {
        let mut found = [(0usize, 0usize); LOOKED_UP_KEYS.len()];
        let mut n = 0;
        if self.unrecorded {
            n = self.scan_looked_up(&mut found);
        } else {
            for (i, &at) in self.first.iter().enumerate() {
                if at != 0 {
                    found[n] = (at as usize, i);
                    n += 1;
                }
            }
        }
        found[..n].sort_unstable_by_key(|&(at, _)| at);
        found
            .into_iter()
            .take(n)
            .filter_map(|(at, i)| Some((LOOKED_UP_KEYS[i], self.value_at(at)?)))
    }

    /// True when an attribute is named by one of the [`LOOKED_UP_KEYS`] (the tests' check
    /// of the offsets pushed).
    #[cfg(test)]
    fn has_looked_up_keys(&self) -> bool {
        self.unrecorded || self.first.iter().any(|&at| at != 0)
    }

    /// The value of the first attribute named `key`; only that value is read back, and
    /// for one of the [`LOOKED_UP_KEYS`] without a scan.
    pub fn get(&self, key: &str) -> Option<AnyValueRef<'_>> {
        match looked_up_index(key.as_bytes()) {
            Some(i) if !self.unrecorded => match self.first[i] {
                0 => None,
                at => self.value_at(at as usize),
            },
            _ => self
                .raw()
                .find(|(k, _)| *k == key.as_bytes())
                .and_then(|(_, v)| v.read()),
        }
    }

    /// What `first` would hold, found by a scan, for a list too long for it: each
    /// looked-up key's first value offset with its index in [`LOOKED_UP_KEYS`]; returns how
    /// many of `found` it filled.
    #[cold]
    fn scan_looked_up(&self, found: &mut [(usize, usize); LOOKED_UP_KEYS.len()]) -> usize {
        let mut r = Reader { b: &self.bytes };
        let mut n = 0;
        for _ in 0..self.len {
            let Some(key) = r.bytes() else { break };
            let at = self.bytes.len() - r.b.len();
            if let Some(i) = looked_up_index(key) {
                if !found[..n].iter().any(|&(_, j)| j == i) {
                    found[n] = (at, i);
                    n += 1;
                }
            }
            if r.skip_value().is_none() {
                break;
            }
        }
        n
    }

    fn items(&self) -> Items<'_> {
        Items {
            r: Reader { b: &self.bytes },
            left: self.len,
        }
    }

    /// The value written at `at` in `bytes`.
    fn value_at(&self, at: usize) -> Option<AnyValueRef<'_>> {
        Reader {
            b: self.bytes.get(at..)?,
        }
        .value()
    }

    /// Each attribute's key, as bytes, with its value still encoded: a scan that reads a
    /// value only when asked ([`RawValue::read`]).
    pub fn raw(&self) -> RawIter<'_> {
        RawIter(self.items())
    }

    /// Owned copies of the attributes.
    pub fn to_owned_attributes(&self) -> Vec<KeyValue> {
        self.iter()
            .map(|kv| KeyValue {
                key: kv.key.to_string(),
                value: kv.value.to_owned_value(),
            })
            .collect()
    }
}

/// The attributes of an [`EncodedAttributes`] as (key bytes, encoded value), in order.
#[derive(Clone, Debug)]
pub struct RawIter<'a>(Items<'a>);

impl<'a> Iterator for RawIter<'a> {
    type Item = (&'a [u8], RawValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next(Reader::raw_key_value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.0.left, Some(self.0.left))
    }
}

/// One attribute value, still encoded.
#[derive(Clone, Copy, Debug)]
pub struct RawValue<'a>(&'a [u8]);

impl<'a> RawValue<'a> {
    /// The value, read back.
    pub fn read(self) -> Option<AnyValueRef<'a>> {
        Reader { b: self.0 }.value()
    }
}

impl<'a> FromIterator<KeyValueRef<'a>> for EncodedAttributes {
    fn from_iter<I: IntoIterator<Item = KeyValueRef<'a>>>(iter: I) -> Self {
        let mut attrs = EncodedAttributes::default();
        for kv in iter {
            attrs.push(kv.key, &kv.value);
        }
        attrs
    }
}

impl From<Vec<KeyValueRef<'_>>> for EncodedAttributes {
    fn from(kvs: Vec<KeyValueRef<'_>>) -> Self {
        kvs.into_iter().collect()
    }
}

impl fmt::Debug for EncodedAttributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As the `Vec<KeyValueRef>` it stands for: a sequence of its attributes (so a
/// [`super::SpanRef`] still serializes to the bytes of its owned twin).
impl Serialize for EncodedAttributes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len))?;
        for kv in self.iter() {
            seq.serialize_element(&kv)?;
        }
        seq.end()
    }
}

/// The attributes of an [`EncodedAttributes`], read back in order.
#[derive(Clone, Debug)]
pub struct Iter<'a>(Items<'a>);

/// The attributes left to read of a list, read one at a time by either iterator.
#[derive(Clone, Debug)]
struct Items<'a> {
    r: Reader<'a>,
    left: usize,
}

impl<'a> Items<'a> {
    /// The next attribute, as `read` reads it.
    fn next<T>(&mut self, read: fn(&mut Reader<'a>) -> Option<T>) -> Option<T> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let item = read(&mut self.r);
        // Only `push` writes the bytes, so they always read back.
        debug_assert!(item.is_some(), "unreadable encoded attributes");
        if item.is_none() {
            self.left = 0;
        }
        item
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = KeyValueRef<'a>;

    fn next(&mut self) -> Option<KeyValueRef<'a>> {
        self.0.next(Reader::key_value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.0.left, Some(self.0.left))
    }
}

/// Reads what the writers above write. `None`: the bytes end early or are not UTF-8
/// where text is due.
#[derive(Clone, Debug)]
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.b.split_first()?;
        self.b = rest;
        Some(first)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (taken, rest) = self.b.split_at(n);
        self.b = rest;
        Some(taken)
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        self.take(n)
    }

    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    fn raw_key_value(&mut self) -> Option<(&'a [u8], RawValue<'a>)> {
        let key = self.bytes()?;
        let start = self.b;
        self.skip_value()?;
        let value = &start[..start.len() - self.b.len()];
        Some((key, RawValue(value)))
    }

    /// Moves past one value without reading its text.
    fn skip_value(&mut self) -> Option<()> {
        match self.byte()? {
            0 => {}
            1 | 5 => {
                self.bytes()?;
            }
            2 => {
                self.byte()?;
            }
            3 => {
                self.varint()?;
            }
            4 => {
                self.take(8)?;
            }
            6 => {
                for _ in 0..self.varint()? {
                    self.skip_value()?;
                }
            }
            7 => {
                for _ in 0..self.varint()? {
                    self.bytes()?;
                    self.skip_value()?;
                }
            }
            _ => return None,
        }
        Some(())
    }

    fn key_value(&mut self) -> Option<KeyValueRef<'a>> {
        let key = self.text()?;
        let value = self.value()?;
        Some(KeyValueRef { key, value })
    }

    fn value(&mut self) -> Option<AnyValueRef<'a>> {
        Some(match self.byte()? {
            0 => AnyValueRef::Empty,
            1 => AnyValueRef::String(self.text()?),
            2 => AnyValueRef::Bool(self.byte()? != 0),
            3 => {
                let z = self.varint()?;
                AnyValueRef::Int((z >> 1) as i64 ^ -((z & 1) as i64))
            }
            4 => {
                let bits: [u8; 8] = self.take(8)?.try_into().ok()?;
                AnyValueRef::Double(f64::from_bits(u64::from_le_bytes(bits)))
            }
            5 => AnyValueRef::Bytes(self.bytes()?),
            6 => {
                let n = usize::try_from(self.varint()?).ok()?;
                // Each item is at least one byte: a count past the end is not believed.
                let mut items = Vec::with_capacity(n.min(self.b.len()));
                for _ in 0..n {
                    items.push(self.value()?);
                }
                AnyValueRef::Array(items)
            }
            7 => {
                let n = usize::try_from(self.varint()?).ok()?;
                let mut kvs = Vec::with_capacity(n.min(self.b.len()));
                for _ in 0..n {
                    kvs.push(self.key_value()?);
                }
                AnyValueRef::KvList(kvs)
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<KeyValueRef<'static>> {
        vec![
            KeyValueRef {
                key: "gen_ai.tool.name",
                value: AnyValueRef::String("caf\u{e9}"),
            },
            KeyValueRef {
                key: "",
                value: AnyValueRef::Empty,
            },
            KeyValueRef {
                key: "b",
                value: AnyValueRef::Bool(true),
            },
            KeyValueRef {
                key: "i",
                value: AnyValueRef::Int(i64::MIN),
            },
            KeyValueRef {
                key: "j",
                value: AnyValueRef::Int(-1),
            },
            KeyValueRef {
                key: "d",
                value: AnyValueRef::Double(-0.5),
            },
            KeyValueRef {
                key: "x",
                value: AnyValueRef::Bytes(&[0, 0xff]),
            },
            KeyValueRef {
                key: "n",
                value: AnyValueRef::KvList(vec![KeyValueRef {
                    key: "a",
                    value: AnyValueRef::Array(vec![AnyValueRef::Int(300), AnyValueRef::Empty]),
                }]),
            },
            KeyValueRef {
                key: "gen_ai.tool.name",
                value: AnyValueRef::String("second"),
            },
        ]
    }

    #[test]
    fn attributes_read_back_as_pushed_and_the_first_of_a_key_is_found() {
        let kvs = sample();
        let attrs = EncodedAttributes::from(kvs.clone());
        assert_eq!(attrs.len(), kvs.len());
        assert_eq!(attrs.iter().collect::<Vec<_>>(), kvs);
        assert_eq!(
            attrs.get("gen_ai.tool.name"),
            Some(AnyValueRef::String("caf\u{e9}"))
        );
        assert_eq!(attrs.get("missing"), None);
        assert_eq!(
            attrs.get("n").map(|v| v.to_owned_value()),
            Some(kvs[7].value.to_owned_value())
        );
        assert_eq!(attrs.get("x"), Some(AnyValueRef::Bytes(&[0, 0xff])));
        let raw: Vec<_> = attrs.raw().map(|(k, v)| (k, v.read())).collect();
        assert_eq!(raw.len(), kvs.len());
        for ((k, v), kv) in raw.iter().zip(&kvs) {
            assert_eq!(*k, kv.key.as_bytes());
            assert_eq!(
                v.as_ref().map(|v| v.to_owned_value()),
                Some(kv.value.to_owned_value())
            );
        }
        assert!(attrs.has_looked_up_keys());
        assert_eq!(
            attrs.looked_up().collect::<Vec<_>>(),
            [("gen_ai.tool.name", AnyValueRef::String("caf\u{e9}"))]
        );
        let plain: EncodedAttributes = kvs[1..4].iter().cloned().collect();
        assert!(!plain.has_looked_up_keys());
        assert_eq!(plain.get("gen_ai.tool.name"), None);
        assert_eq!(plain.looked_up().count(), 0);
        let owned = attrs.to_owned_attributes();
        assert_eq!(owned.len(), kvs.len());
        assert_eq!(owned[3].key, "i");
        assert_eq!(owned[3].value, super::super::AnyValue::Int(i64::MIN));
    }

    /// Each looked-up key is found by its own index, and only by it; the first attribute
    /// of a key is the one looked up, and they come in attribute order.
    #[test]
    fn looked_up_keys_are_found_in_attribute_order() {
        for (i, key) in LOOKED_UP_KEYS.iter().enumerate() {
            assert_eq!(looked_up_index(key.as_bytes()), Some(i), "{key}");
            let longer = format!("{key}x");
            assert_eq!(looked_up_index(longer.as_bytes()), None, "{key}");
            let mut near = key.as_bytes().to_vec();
            near[0] ^= 1;
            assert_eq!(looked_up_index(&near), None, "{key}");
        }
        let mut attrs = EncodedAttributes::default();
        attrs.push_scalar("service.name", Scalar::String("svc"));
        attrs.push_scalar("other", Scalar::Int(1));
        attrs.push(
            "error.type",
            &AnyValueRef::Array(vec![AnyValueRef::Bool(true)]),
        );
        attrs.push_scalar("service.name", Scalar::String("second"));
        attrs.push_scalar("process.pid", Scalar::Int(42));
        let found: Vec<_> = attrs
            .looked_up()
            .map(|(k, v)| (k, v.to_owned_value()))
            .collect();
        assert_eq!(
            found,
            [
                ("service.name", AnyValueRef::String("svc").to_owned_value()),
                (
                    "error.type",
                    AnyValueRef::Array(vec![AnyValueRef::Bool(true)]).to_owned_value()
                ),
                ("process.pid", AnyValueRef::Int(42).to_owned_value()),
            ]
        );
        assert_eq!(attrs.get("process.pid"), Some(AnyValueRef::Int(42)));
        assert_eq!(attrs.get("other"), Some(AnyValueRef::Int(1)));
        assert_eq!(attrs.get(LOGFIRE_SPAN_TYPE), None);
        // a list whose offsets did not fit in `first` scans, and finds the same
        let scanned = EncodedAttributes {
            first: [0; LOOKED_UP_KEYS.len()],
            unrecorded: true,
            ..attrs.clone()
        };
        let again: Vec<_> = scanned
            .looked_up()
            .map(|(k, v)| (k, v.to_owned_value()))
            .collect();
        assert_eq!(again, found);
        assert!(scanned.has_looked_up_keys());
        assert_eq!(scanned.get("process.pid"), Some(AnyValueRef::Int(42)));
        assert_eq!(scanned.get(LOGFIRE_SPAN_TYPE), None);
        // the scalar writer writes what the general one writes
        for v in [
            Scalar::String("s"),
            Scalar::Bool(false),
            Scalar::Int(-300),
            Scalar::Double(2.5),
            Scalar::Bytes(&[1, 2]),
        ] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            write_scalar(&mut a, v);
            write_value(&mut b, &v.into());
            assert_eq!(a, b, "{v:?}");
        }
    }

    #[test]
    fn write_to_puts_the_count_before_the_bytes() {
        let attrs: EncodedAttributes = sample().into_iter().take(3).collect();
        let mut out = vec![0xAA];
        attrs.write_to(&mut out);
        assert_eq!(out[..2], [0xAA, 3]);
        assert_eq!(&out[2..], attrs.as_bytes());
        let mut listed = Vec::new();
        write_key_values(&mut listed, &sample()[..3]);
        assert_eq!(listed, out[1..]);
    }

    #[test]
    fn damaged_bytes_read_as_none_not_a_panic() {
        let mut r = Reader { b: &[1, 5, b'a'] };
        assert!(r.value().is_none());
        let mut r = Reader { b: &[9] };
        assert!(r.value().is_none());
        let mut r = Reader { b: &[0xff; 11] };
        assert!(r.varint().is_none());
        let mut r = Reader { b: &[1, 1, 0xc3] };
        assert!(r.value().is_none());
    }
}
