//! Field paths for error messages (`resourceSpans[0].scopeSpans[0].spans[1].traceId`).
//!
//! A path is a chain of stack frames, built for free while walking a request and rendered
//! to text only when something is wrong, so the happy path allocates nothing for it.
//! Paths use the OTLP/JSON lowerCamelCase names for both encodings.

use std::fmt;

/// One step of a path.
#[derive(Clone, Copy, Debug)]
enum Seg {
    Root,
    Field(&'static str),
    Index(usize),
}

/// A position inside a request.
#[derive(Clone, Copy, Debug)]
pub struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    seg: Seg,
}

impl Path<'static> {
    /// The request itself.
    pub const ROOT: Path<'static> = Path {
        parent: None,
        seg: Seg::Root,
    };
}

impl<'a> Path<'a> {
    /// The member `name` of this object.
    pub fn field(&'a self, name: &'static str) -> Path<'a> {
        Path {
            parent: Some(self),
            seg: Seg::Field(name),
        }
    }
    /// True for [`Path::ROOT`].
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }
    /// The element `i` of this list.
    pub fn index(&'a self, i: usize) -> Path<'a> {
        Path {
            parent: Some(self),
            seg: Seg::Index(i),
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut segs = Vec::new();
        let mut cur = Some(self);
        while let Some(p) = cur {
            segs.push(p.seg);
            cur = p.parent;
        }
        let mut first = true;
        for seg in segs.iter().rev() {
            match seg {
                Seg::Root => {}
                Seg::Field(name) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(name)?;
                    first = false;
                }
                Seg::Index(i) => {
                    write!(f, "[{i}]")?;
                    first = false;
                }
            }
        }
        if first {
            f.write_str("(request)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_dotted_and_indexed() {
        let r = Path::ROOT;
        let a = r.field("resourceSpans");
        let b = a.index(0);
        let c = b.field("scopeSpans");
        let d = c.index(2);
        let e = d.field("traceId");
        assert_eq!(e.to_string(), "resourceSpans[0].scopeSpans[2].traceId");
        assert_eq!(Path::ROOT.to_string(), "(request)");
    }
}
