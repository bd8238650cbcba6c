//! A small glob matcher for tool and span names, in place of the `globset` crate.
//!
//! Why it exists: `globset` compiles every glob to a regular expression and so links a regex
//! engine into the binary (regex-automata, regex-syntax and aho-corasick, about 0.7 MB of a
//! 13.5 MB binary; issue 16, binary size). The watchdog matches short names against a handful
//! of globs (`[[watchdog.sla_rule]] tool`, `class_tools`, `tool_name_patterns`), which needs
//! none of that. Matching SLA rules is the watchdog's core, so the syntax and the results are
//! those of `globset::Glob::new` with its defaults (case-sensitive, `*` and `?` match `/`,
//! `\` escapes), and a property test in this module checks both against globset (a
//! dev-dependency only) on random globs and names.
//!
//! # Syntax
//!
//! A glob matches a whole name (anchored at both ends), case-sensitively, one character
//! (Unicode scalar value) at a time:
//!
//! - `*`: any run of characters, the empty one and `/` included. `**` means the same as `*`
//!   (globset's path meanings of `**/` do not apply, see the differences below).
//! - `?`: exactly one character.
//! - `[abc]`, `[a-z]`: one character of the class; `[!a-z]` or `[^a-z]`: one character not in
//!   it. A `]` right after `[` (or `[!`) is literal (`[]a]`), so is a `-` first or last
//!   (`[-a]`, `[a-]`), and so is every other character inside a class: `*`, `?`, `{`, `,` and
//!   `\` too (`[*]` matches `*`; there are no escapes in a class). A range whose end is below
//!   its start (`[z-a]`) is an error; a `-` right after a range moves its end (`[a-c-e]` is
//!   `[a-e]`), both as in globset.
//! - `{a,b,c}`: any of the alternatives, each a glob itself; groups nest (`{a,b{c,d}}`, at
//!   most [`MAX_NESTING`] deep). Outside a group `,` is literal. An empty alternative is
//!   ignored unless every alternative of the group is empty, as with globset's default
//!   (`empty_alternates(false)`): `x{,y}` matches `xy` but not `x`, while `x{}` and `x{,}`
//!   match `x`.
//! - `\c`: the character `c` itself (`\*`, `\?`, `\[`, `\{`, `\,`, `\\`); a `\` at the end of
//!   the glob is an error.
//! - Anything else matches itself.
//!
//! Errors say what is wrong and where (a byte offset into the glob): [`GlobError`].
//!
//! # Cost
//!
//! A name longer than [`MAX_NAME_BYTES`] matches no glob (so such a tool span gets the
//! default SLA and no class cap), which bounds the work per name whatever the globs. A
//! glob is at most [`MAX_GLOB_BYTES`] long. [`Glob::new`] expands the `{…}` groups into
//! at most [`MAX_ALTERNATIVES`] token lists without groups, holding at most [`MAX_TOKENS`]
//! tokens in all; past either it is refused. A list of only literals and stars (the usual
//! SLA glob: `run_notebook*`, `*render*`) is matched as literal runs: a prefix, a suffix and
//! a substring search (`memchr::memmem`) for each run between, one pass over the name
//! whatever its length (an exporter chooses `gen_ai.tool.name`, and a name of megabytes
//! matched a character at a time against the eleven default class globs held the watchdog
//! for seconds). Any other list is matched by the usual greedy-star backtracking that only
//! remembers the last `*`, at most (name length × list length) steps: there is no
//! exponential backtracking (`*a*a*a*a*a*b` against 10 000 `a`s answers at once).
//!
//! # Differences from globset (0.4.22, `Glob::new`)
//!
//! Everything else agrees, refusals included: the property test allows differences 1 and 3
//! (it compares no names for a glob where globset may read a `**` as a path component) and
//! its alphabet leaves out 2, 4 and 5, which unit tests show.
//!
//! 1. `**` is `*`. globset gives path meanings to a `**` that is a whole path component (after
//!    the start of the glob or of an alternative, or after a `/`; before a `/` or the end of
//!    the glob or of an alternative): its `**/x` also matches `x` and its `a/**/b` also
//!    matches `a/b`; here they do not (`**/x` needs a `/` before the `x`). A last `/**`
//!    (`a/**`) and every other `**` (`a**b`, `**a`) mean `*` in both. globset also drops an
//!    escaped `,` or `{` right before a `**` in a group (its `{a\,**}` is `a/*`, here `a,*`).
//!    Older globset releases refused some placements of `**` (`InvalidRecursive`); 0.4.22
//!    refuses none, and neither do we.
//! 2. POSIX classes are refused: a `[:name:]` of at most 8 lowercase letters inside a class
//!    (`[[:alpha:]]`) is an error. globset 0.4.22 expands the twelve POSIX names to ASCII
//!    ranges and silently drops an unknown one (its `[[:foo:]]` matches only `[`). A `[:` that
//!    does not continue that way is literal in both (`[[:]` is the class of `[` and `:`).
//! 3. A glob whose groups expand to more than [`MAX_ALTERNATIVES`] alternatives (nine `{a,b}`
//!    in a row make 512) is refused; globset has no such limit.
//! 4. Non-ASCII names: globset matches a byte regex, so its `?` and classes match one byte of
//!    the UTF-8 encoding (its `?` does not match `é` but `??` does, and `[é]` never matches
//!    `é`); here they match one character. Literal characters agree.
//! 5. `\` always escapes. globset does so on Unix only: on Windows its `Glob::new` reads `\` as
//!    a path separator (`/`), and its matchers turn `\` in names into `/`.

use std::fmt;

/// Most alternatives a glob's `{…}` groups may expand to (see the module docs, "Cost").
pub const MAX_ALTERNATIVES: usize = 256;

/// Deepest nesting of `{…}` groups (globset's limit too).
pub const MAX_NESTING: usize = 100;

/// Longest name a glob is matched against, bytes (4 KiB): a longer name matches no glob.
/// MCP tool names are at most 128 characters (MCP spec, Tools); a name of megabytes (an
/// exporter chooses `gen_ai.tool.name` and span names) would cost every glob a pass over
/// it, and a glob with classes or many alternatives several, while the watchdog waits.
pub const MAX_NAME_BYTES: usize = 4096;

/// Longest glob, bytes (4 KiB): a tool or span name glob is a few dozen bytes, and with
/// [`MAX_ALTERNATIVES`] this bounds what one glob costs to compile and hold (at most
/// [`MAX_TOKENS`] tokens).
pub const MAX_GLOB_BYTES: usize = 4096;

/// Most tokens a glob's alternatives may hold in all, after expansion (64 Ki).
pub const MAX_TOKENS: usize = 65_536;

/// Why a glob was refused. `at` and the numbers in the messages are byte offsets into the glob.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    /// A `[` without its closing `]`.
    #[error("unclosed character class `[` at {at}")]
    UnclosedClass {
        /// Offset of the `[`.
        at: usize,
    },
    /// A range in a class whose end is below its start, e.g. `[z-a]`.
    #[error("invalid character range `{start}-{end}` at {at}: its end is below its start")]
    InvalidRange {
        /// First character of the range.
        start: char,
        /// Last character of the range.
        end: char,
        /// Offset of the range's first character.
        at: usize,
    },
    /// A `[:name:]` inside a class.
    #[error(
        "POSIX character classes like `[[:alpha:]]` are not supported (`[:{name}:]` at {at}); \
         list the characters instead, e.g. `[a-zA-Z]`"
    )]
    PosixClass {
        /// The class name.
        name: String,
        /// Offset of the `[` of `[:`.
        at: usize,
    },
    /// A `{` without its closing `}`.
    #[error("unclosed alternation `{{` at {at}")]
    UnclosedAlternation {
        /// Offset of the innermost unclosed `{`.
        at: usize,
    },
    /// A `}` without an open `{`.
    #[error("unmatched `}}` at {at}")]
    UnmatchedClose {
        /// Offset of the `}`.
        at: usize,
    },
    /// A `\` that ends the glob.
    #[error("dangling `\\` at end")]
    DanglingEscape,
    /// `{…}` groups nested deeper than [`MAX_NESTING`].
    #[error("alternations `{{` nested more than {MAX_NESTING} deep at {at}")]
    TooDeeplyNested {
        /// Offset of the first `{` too deep.
        at: usize,
    },
    /// The `{…}` groups expand to more than [`MAX_ALTERNATIVES`] alternatives, or to more
    /// than [`MAX_TOKENS`] tokens in all.
    #[error(
        "the alternations `{{…}}` expand to more than {MAX_ALTERNATIVES} alternatives, or to \
         more than {MAX_TOKENS} characters and classes in all; split the glob into several"
    )]
    TooManyAlternatives,
    /// The glob is longer than [`MAX_GLOB_BYTES`].
    #[error("the glob is {len} bytes long, over the limit of {MAX_GLOB_BYTES}")]
    TooLong {
        /// Its length, bytes.
        len: usize,
    },
}

/// One element of an alternation-free glob; each but `Star` matches exactly one character.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`
    Any,
    /// `*` (and `**`)
    Star,
    /// `[…]`: inclusive ranges, a single character being `(c, c)`.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// Whether this one-character token matches `c` (`Star` is handled by the matcher).
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::Any | Token::Star => true,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

/// The parsed glob before expansion: tokens and `{…}` groups of alternatives.
#[derive(Debug)]
enum Node {
    Token(Token),
    Group(Vec<Vec<Node>>),
}

/// A compiled glob: see the module docs for its syntax.
#[derive(Clone)]
pub struct Glob {
    pattern: String,
    /// The alternation-free token lists the glob expands to (at least one), compiled; a
    /// name matches when any of them matches it whole.
    alternatives: Vec<Matcher>,
}

/// One alternation-free token list, ready to match.
#[derive(Clone, Debug)]
struct Matcher {
    tokens: Vec<Token>,
    /// When the tokens are only literals and stars (`run_notebook*`, `*render*`, the usual
    /// SLA globs): the literal runs between the stars, as UTF-8 bytes, one more than the
    /// stars (the first and the last may be empty), matched by [`match_literal_runs`] in
    /// time linear in the name, whatever its length. Else [`match_tokens`].
    runs: Option<Vec<Vec<u8>>>,
}

impl Matcher {
    fn new(tokens: Vec<Token>) -> Matcher {
        let mut runs = Some(vec![Vec::new()]);
        for t in &tokens {
            match (t, runs.as_mut()) {
                (Token::Star, Some(r)) => r.push(Vec::new()),
                (Token::Literal(c), Some(r)) => {
                    let mut buf = [0u8; 4];
                    if let Some(run) = r.last_mut() {
                        run.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
                _ => runs = None,
            }
        }
        Matcher { tokens, runs }
    }

    fn is_match(&self, name: &str) -> bool {
        match &self.runs {
            Some(runs) => match_literal_runs(runs, name.as_bytes()),
            None => match_tokens(&self.tokens, name),
        }
    }
}

/// Whether `name` is `runs[0]`, then any text, `runs[1]`, ..., any text, `runs[last]`
/// (the runs between stars; one run means no star). The first run must be a prefix and
/// the last a suffix, not overlapping; each middle run is taken at its leftmost place after
/// the one before, which finds a match whenever there is one. Byte-wise comparison is
/// exact here: UTF-8 is self-synchronizing, so a run found in a valid name starts and ends
/// on character boundaries.
fn match_literal_runs(runs: &[Vec<u8>], name: &[u8]) -> bool {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return name.is_empty();
    };
    if runs.len() == 1 {
        return name == first.as_slice();
    }
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for run in &runs[1..runs.len() - 1] {
        match memchr::memmem::find(rest, run) {
            Some(at) => rest = &rest[at + run.len()..],
            None => return false,
        }
    }
    true
}

impl Glob {
    /// Compiles `pattern`. Errors: [`GlobError`], naming the problem and its byte offset.
    pub fn new(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.len() > MAX_GLOB_BYTES {
            return Err(GlobError::TooLong { len: pattern.len() });
        }
        let nodes = parse(pattern)?;
        let mut alternatives = expand(&nodes)?;
        for alt in &mut alternatives {
            // `**`, and stars that met across an empty group, are one `*`.
            alt.dedup_by(|a, b| *a == Token::Star && *b == Token::Star);
        }
        let mut unique: Vec<Vec<Token>> = Vec::with_capacity(alternatives.len());
        for alt in alternatives {
            if !unique.contains(&alt) {
                unique.push(alt);
            }
        }
        Ok(Glob {
            pattern: pattern.to_string(),
            alternatives: unique.into_iter().map(Matcher::new).collect(),
        })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `name`, whole, matches the glob; a name longer than [`MAX_NAME_BYTES`]
    /// matches no glob.
    pub fn is_match(&self, name: &str) -> bool {
        name.len() <= MAX_NAME_BYTES && self.alternatives.iter().any(|m| m.is_match(name))
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Glob").field(&self.pattern).finish()
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)
    }
}

/// Several globs: a name matches the set when it matches any of them.
#[derive(Clone, Debug, Default)]
pub struct GlobSet {
    globs: Vec<Glob>,
}

impl GlobSet {
    /// The set of `globs`.
    pub fn new(globs: Vec<Glob>) -> GlobSet {
        GlobSet { globs }
    }

    /// The set without globs, which matches nothing.
    pub fn empty() -> GlobSet {
        GlobSet::default()
    }

    /// Number of globs in the set.
    pub fn len(&self) -> usize {
        self.globs.len()
    }

    /// True when the set has no glob.
    pub fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    /// Whether `name` matches any glob of the set.
    pub fn is_match(&self, name: &str) -> bool {
        self.globs.iter().any(|g| g.is_match(name))
    }
}

impl FromIterator<Glob> for GlobSet {
    fn from_iter<I: IntoIterator<Item = Glob>>(iter: I) -> Self {
        GlobSet::new(iter.into_iter().collect())
    }
}

/// An open `{` while parsing.
struct OpenGroup {
    at: usize,
    alternatives: Vec<Vec<Node>>,
}

/// Parses `pattern` into nodes, with an explicit stack for the groups (no recursion).
fn parse(pattern: &str) -> Result<Vec<Node>, GlobError> {
    let chars: Vec<(usize, char)> = pattern.char_indices().collect();
    let mut root: Vec<Node> = Vec::new();
    let mut open: Vec<OpenGroup> = Vec::new();
    let mut i = 0;
    while let Some(&(at, c)) = chars.get(i) {
        i += 1;
        let node = match c {
            '*' => Node::Token(Token::Star),
            '?' => Node::Token(Token::Any),
            '\\' => match chars.get(i) {
                Some(&(_, escaped)) => {
                    i += 1;
                    Node::Token(Token::Literal(escaped))
                }
                None => return Err(GlobError::DanglingEscape),
            },
            '[' => {
                let (class, next) = parse_class(&chars, i, at)?;
                i = next;
                Node::Token(class)
            }
            '{' => {
                if open.len() >= MAX_NESTING {
                    return Err(GlobError::TooDeeplyNested { at });
                }
                open.push(OpenGroup {
                    at,
                    alternatives: vec![Vec::new()],
                });
                continue;
            }
            ',' if !open.is_empty() => {
                if let Some(group) = open.last_mut() {
                    group.alternatives.push(Vec::new());
                }
                continue;
            }
            '}' => match open.pop() {
                Some(group) => Node::Group(group.alternatives),
                None => return Err(GlobError::UnmatchedClose { at }),
            },
            c => Node::Token(Token::Literal(c)),
        };
        let current = open
            .last_mut()
            .and_then(|g| g.alternatives.last_mut())
            .unwrap_or(&mut root);
        current.push(node);
    }
    match open.last() {
        Some(group) => Err(GlobError::UnclosedAlternation { at: group.at }),
        None => Ok(root),
    }
}

/// Parses a class whose `[` (at byte `open_at`) precedes `chars[i]`; returns the class and
/// the index after its `]`. Follows globset's reading of `]`, `-`, `!` and `^`.
fn parse_class(
    chars: &[(usize, char)],
    mut i: usize,
    open_at: usize,
) -> Result<(Token, usize), GlobError> {
    let negated = matches!(chars.get(i), Some((_, '!' | '^')));
    if negated {
        i += 1;
    }
    let mut ranges: Vec<(char, char)> = Vec::new();
    let mut last_at = open_at;
    let mut first = true;
    let mut in_range = false;
    loop {
        let Some(&(at, c)) = chars.get(i) else {
            return Err(GlobError::UnclosedClass { at: open_at });
        };
        i += 1;
        match c {
            ']' if !first => break,
            '-' if first => {
                ranges.push(('-', '-'));
                last_at = at;
            }
            '-' if !in_range => in_range = true,
            _ => {
                if c == '[' && !in_range {
                    if let Some(name) = posix_class_name(chars, i) {
                        return Err(GlobError::PosixClass { name, at });
                    }
                }
                if in_range {
                    // `in_range` is only set after a first character, so a range exists.
                    if let Some(r) = ranges.last_mut() {
                        if c < r.0 {
                            return Err(GlobError::InvalidRange {
                                start: r.0,
                                end: c,
                                at: last_at,
                            });
                        }
                        r.1 = c;
                    }
                    in_range = false;
                } else {
                    ranges.push((c, c));
                    last_at = at;
                }
            }
        }
        first = false;
    }
    if in_range {
        ranges.push(('-', '-'));
    }
    Ok((Token::Class { negated, ranges }, i))
}

/// The name when `chars[i..]` reads `:name:]` with at most 8 lowercase ASCII letters, the
/// continuations of a `[` inside a class that globset takes for a POSIX class.
fn posix_class_name(chars: &[(usize, char)], i: usize) -> Option<String> {
    if !matches!(chars.get(i), Some((_, ':'))) {
        return None;
    }
    let mut name = String::new();
    for (k, &(_, c)) in chars.iter().enumerate().skip(i + 1) {
        match c {
            ':' if matches!(chars.get(k + 1), Some((_, ']'))) => return Some(name),
            c if c.is_ascii_lowercase() && name.len() < 8 => name.push(c),
            _ => return None,
        }
    }
    None
}

/// Whether the node sequence is more than empty groups: globset drops an alternative that
/// compiles to nothing, and a group all of whose alternatives do compiles to nothing.
fn has_content(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| match n {
        Node::Token(_) => true,
        Node::Group(alts) => alts.iter().any(|a| has_content(a)),
    })
}

fn tokens_in(lists: &[Vec<Token>]) -> usize {
    lists.iter().map(Vec::len).sum()
}

/// Expands the groups of `nodes` into alternation-free token lists.
fn expand(nodes: &[Node]) -> Result<Vec<Vec<Token>>, GlobError> {
    let mut out: Vec<Vec<Token>> = vec![Vec::new()];
    for node in nodes {
        match node {
            Node::Token(t) => {
                // every alternative so far grows by one token
                if tokens_in(&out) + out.len() > MAX_TOKENS {
                    return Err(GlobError::TooManyAlternatives);
                }
                out.iter_mut().for_each(|alt| alt.push(t.clone()));
            }
            Node::Group(alts) => {
                let mut choices: Vec<Vec<Token>> = Vec::new();
                for alt in alts.iter().filter(|a| has_content(a)) {
                    choices.extend(expand(alt)?);
                    if choices.len() > MAX_ALTERNATIVES {
                        return Err(GlobError::TooManyAlternatives);
                    }
                }
                // A group without content matches the empty string: nothing to add.
                if choices.is_empty() {
                    continue;
                }
                if out.len().saturating_mul(choices.len()) > MAX_ALTERNATIVES {
                    return Err(GlobError::TooManyAlternatives);
                }
                let tokens = tokens_in(&out).saturating_mul(choices.len())
                    + tokens_in(&choices).saturating_mul(out.len());
                if tokens > MAX_TOKENS {
                    return Err(GlobError::TooManyAlternatives);
                }
                out = out
                    .iter()
                    .flat_map(|prefix| {
                        choices.iter().map(move |choice| {
                            let mut alt = prefix.clone();
                            alt.extend(choice.iter().cloned());
                            alt
                        })
                    })
                    .collect();
            }
        }
    }
    Ok(out)
}

/// Whether `name`, whole, matches the alternation-free `tokens`: greedy `*` with
/// backtracking to the last `*` only, which is complete for these tokens and takes at most
/// `name.len() × tokens.len()` steps.
fn match_tokens(tokens: &[Token], name: &str) -> bool {
    let next_char = |at: usize| name.get(at..).and_then(|rest| rest.chars().next());
    let mut t = 0;
    let mut at = 0;
    // The token after the last `*` seen, and where in the name that `*`'s match ends.
    let mut last_star: Option<(usize, usize)> = None;
    loop {
        match tokens.get(t) {
            Some(Token::Star) => {
                t += 1;
                last_star = Some((t, at));
                continue;
            }
            Some(token) => {
                if let Some(c) = next_char(at) {
                    if token.matches(c) {
                        t += 1;
                        at += c.len_utf8();
                        continue;
                    }
                }
            }
            None if at == name.len() => return true,
            None => {}
        }
        // Mismatch: let the last `*` take one more character, or fail without one.
        let Some((after_star, star_end)) = last_star else {
            return false;
        };
        let Some(c) = next_char(star_end) else {
            return false;
        };
        t = after_star;
        at = star_end + c.len_utf8();
        last_star = Some((t, at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn glob(p: &str) -> Glob {
        Glob::new(p).unwrap_or_else(|e| panic!("{p:?}: {e}"))
    }

    fn err(p: &str) -> GlobError {
        match Glob::new(p) {
            Ok(g) => panic!("{p:?} was accepted: {:?}", g.alternatives),
            Err(e) => e,
        }
    }

    /// globset with the options `Glob::new` has on Unix, on every platform.
    fn theirs(p: &str) -> Result<globset::GlobMatcher, globset::Error> {
        globset::GlobBuilder::new(p)
            .backslash_escape(true)
            .build()
            .map(|g| g.compile_matcher())
    }

    /// Asserts that `p` matches exactly the `yes` names among `yes` and `no`, here and in
    /// globset.
    fn check(p: &str, yes: &[&str], no: &[&str]) {
        let ours = glob(p);
        let gs = theirs(p).unwrap_or_else(|e| panic!("globset refused {p:?}: {e}"));
        for n in yes {
            assert!(ours.is_match(n), "{p:?} should match {n:?}");
            assert!(gs.is_match(n), "globset: {p:?} should match {n:?}");
        }
        for n in no {
            assert!(!ours.is_match(n), "{p:?} should not match {n:?}");
            assert!(!gs.is_match(n), "globset: {p:?} should not match {n:?}");
        }
    }

    /// Asserts that both refuse `p`.
    fn both_refuse(p: &str) -> GlobError {
        assert!(theirs(p).is_err(), "globset accepted {p:?}");
        err(p)
    }

    #[test]
    fn literals_are_anchored_and_case_sensitive() {
        check("run", &["run"], &["", "ru", "runs", "xrun", "Run", "RUN"]);
        check("", &[""], &["a"]);
        check("a/b", &["a/b"], &["a", "ab", "a/b/"]);
        check("a,b", &["a,b"], &["a", "b"]);
        check("!-]^x", &["!-]^x"], &["!"]);
    }

    #[test]
    fn star_matches_any_run_including_slash() {
        check(
            "run_notebook*",
            &["run_notebook", "run_notebook_2", "run_notebook/x"],
            &["run_noteboo", "xrun_notebook"],
        );
        check(
            "*render*",
            &["render", "x_render_y", "a/render/b"],
            &["rende"],
        );
        check("*", &["", "a", "a/b/c", "*"], &[]);
        check("a*b*c", &["abc", "a/b/c", "aXbYc", "abbc"], &["ab", "acb"]);
        check(
            "tools/call *",
            &["tools/call run_x", "tools/call "],
            &["tools/call"],
        );
        check("*\n", &["\n", "a\n"], &["a"]);
        check("a*", &["a\nb"], &["b"]);
    }

    #[test]
    fn double_star_is_star() {
        check("a**b", &["ab", "a/x/b", "axb"], &["a", "b"]);
        check("**", &["", "a/b"], &[]);
        check("a/**", &["a/", "a/b/c"], &["a"]);
        check("***", &["", "abc"], &[]);
        check("{**}", &["", "x/y"], &[]);
        check("x{a,**}", &["xa", "x", "x/y"], &[]);
    }

    #[test]
    fn double_star_next_to_slash_differs_from_globset() {
        // Difference 1 in the module docs: here `**` is `*` everywhere.
        let gs = theirs("**/x").unwrap();
        assert!(gs.is_match("x") && gs.is_match("a/x"));
        let ours = glob("**/x");
        assert!(!ours.is_match("x"));
        assert!(ours.is_match("a/x") && ours.is_match("/x") && ours.is_match("a/b/x"));

        let gs = theirs("a/**/b").unwrap();
        assert!(gs.is_match("a/b") && gs.is_match("a/x/b"));
        let ours = glob("a/**/b");
        assert!(!ours.is_match("a/b"));
        assert!(ours.is_match("a/x/b") && ours.is_match("a//b"));

        // globset drops the escaped `,` before a `**` in a group.
        let gs = theirs(r"{a\,**}").unwrap();
        assert!(gs.is_match("a/x") && !gs.is_match("a,x"));
        assert!(ours_match(r"{a\,**}", "a,x") && !ours_match(r"{a\,**}", "a/x"));

        // The same as `*/x`.
        let star = glob("*/x");
        for n in ["x", "/x", "a/x", "ax", "a/b/x"] {
            assert_eq!(ours_match("**/x", n), star.is_match(n), "{n:?}");
        }
    }

    fn ours_match(p: &str, n: &str) -> bool {
        glob(p).is_match(n)
    }

    #[test]
    fn question_mark_is_one_character() {
        check("a?c", &["abc", "a/c", "a?c", "a*c"], &["ac", "abbc"]);
        check("??", &["ab", "//"], &["a", "abc"]);
        check("?*", &["a", "ab"], &[""]);
    }

    #[test]
    fn non_ascii_is_matched_per_character() {
        // Difference 4: `?` and classes take one character here, one byte in globset.
        assert!(ours_match("?", "é"));
        assert!(!ours_match("??", "é"));
        assert!(ours_match("[é]", "é"));
        assert!(ours_match("[!a]", "é"));
        assert!(ours_match("[à-ê]x", "éx"));
        let gs = theirs("??").unwrap();
        assert!(gs.is_match("é"));
        assert!(!theirs("?").unwrap().is_match("é"));
        assert!(!theirs("[é]").unwrap().is_match("é"));
        assert!(theirs("[é][é]").unwrap().is_match("é"));
        assert!(!theirs("[!a]").unwrap().is_match("é"));
        // Literals and stars agree.
        check("é*ß", &["éß", "éxß", "é/ß"], &["eß", "é"]);
        check("*ö?", &["öx", "xöy"], &["ö"]);
    }

    #[test]
    fn classes() {
        check("[abc]", &["a", "b", "c"], &["d", "", "ab", "A"]);
        check("x[a-c]y", &["xay", "xby", "xcy"], &["xdy", "x-y", "xy"]);
        check("[!a-c]", &["d", "/", "-", "!"], &["a", "b", "c", ""]);
        check("[^a-c]", &["d", "^"], &["a", "c"]);
        check("[]a]", &["]", "a"], &["b", "[]a]"]);
        check("[!]a]", &["b", "["], &["]", "a"]);
        check("[-a]", &["-", "a"], &["b"]);
        check("[a-]", &["-", "a"], &["b"]);
        check("[!-]", &["a"], &["-"]);
        check("[*]", &["*"], &["a", ""]);
        check("[?]", &["?"], &["a"]);
        check("[{,}]", &["{", ",", "}"], &["a"]);
        check("[/]", &["/"], &["a"]);
        check("[a-]]", &["a]", "-]"], &["a", "]"]);
        check("[[]", &["["], &["a"]);
    }

    #[test]
    fn class_edge_cases_follow_globset() {
        // No escapes in a class: `\` is a member, the `]` closes it.
        check(r"[\]", &["\\"], &["]"]);
        check(r"[\]]", &["\\]"], &["\\", "]"]);
        check(r"[\*]", &["\\", "*"], &["a"]);
        // A `-` after a range moves the range's end.
        check("[a-c-e]", &["a", "d", "e"], &["-", "f"]);
        check("[a-e-c]", &["a", "c"], &["d", "-"]);
        // A range may start with a literal `]` or `-`.
        check("[]-a]", &["]", "^", "a"], &["b", "-"]);
        check("[--a]", &["-", ".", "a"], &["b"]);
        check("[!--a]", &["b", ","], &["-", "a"]);
        // `^` after `[!` is a member, `!` elsewhere too.
        check("[!^]", &["a"], &["^"]);
        check("[a!]", &["a", "!"], &["b"]);
        // A `[:` that is not a POSIX class name is literal.
        check("[[:]", &["[", ":"], &["a"]);
        check("[[:a]", &["[", ":", "a"], &["b"]);
        check("[[:abcdefghi:]]", &["i]", "[]", ":]"], &["j]"]);
        // After a range's `-`, `[` is the range's end, not a POSIX class.
        check("[A-[:b]", &["B", "[", ":", "b"], &["a"]);
        assert!(matches!(
            both_refuse("[a-[:b]"),
            GlobError::InvalidRange { .. }
        ));
    }

    #[test]
    fn reversed_range_is_an_error_as_in_globset() {
        assert_eq!(
            both_refuse("[z-a]"),
            GlobError::InvalidRange {
                start: 'z',
                end: 'a',
                at: 1
            }
        );
        assert_eq!(
            both_refuse("ab[xz--]"),
            GlobError::InvalidRange {
                start: 'z',
                end: '-',
                at: 4
            }
        );
        check("[a-c-b-a]", &["a"], &["b", "c", "-"]);
        let e = both_refuse("[z-a]").to_string();
        assert_eq!(
            e,
            "invalid character range `z-a` at 1: its end is below its start"
        );
        // A single-character range is fine.
        check("[a-a]", &["a"], &["b"]);
    }

    #[test]
    fn unclosed_class_is_an_error() {
        for (p, at) in [
            ("[", 0),
            ("[]", 0),
            ("[!", 0),
            ("[!]", 0),
            ("ab[a-", 2),
            ("x[]\\", 1),
        ] {
            assert_eq!(both_refuse(p), GlobError::UnclosedClass { at }, "{p:?}");
        }
        assert_eq!(
            both_refuse("abc[x").to_string(),
            "unclosed character class `[` at 3"
        );
    }

    #[test]
    fn posix_classes_are_refused() {
        // Difference 2: globset 0.4.22 accepts them.
        for p in [
            "[[:alpha:]]",
            "x[a[:digit:]]",
            "[![:space:]]",
            "[[:foo:]]",
            "[[::]]",
        ] {
            assert!(theirs(p).is_ok(), "globset refused {p:?}");
            assert!(
                matches!(err(p), GlobError::PosixClass { .. }),
                "{p:?}: {:?}",
                Glob::new(p)
            );
        }
        let e = err("ab[[:alpha:]]").to_string();
        assert!(
            e.starts_with("POSIX character classes like `[[:alpha:]]` are not supported"),
            "{e}"
        );
        assert!(e.contains("`[:alpha:]` at 3"), "{e}");
    }

    #[test]
    fn alternations() {
        check(
            "run_{notebook,cell}*",
            &["run_notebook", "run_cell_2"],
            &["run_", "run_x"],
        );
        check("{a,b,c}", &["a", "b", "c"], &["", "ab", "{a,b,c}"]);
        check("x{a,b{c,d}}y", &["xay", "xbcy", "xbdy"], &["xby", "xcy"]);
        check("{a*,*b}", &["a", "axx", "xxb", "b"], &["x"]);
        check("{[a-c],?x}", &["a", "c", "zx"], &["d", "x"]);
        check("{a}", &["a"], &["", "{a}"]);
        check(
            "{{{a,b}}}{c,{d,e}}",
            &["ac", "ad", "be"],
            &["a", "c", "abc"],
        );
        check(r"{a\,b,c}", &["a,b", "c"], &["a", "b"]);
        check(r"{a\}b}", &["a}b"], &["a"]);
        check(r"\{a,b\}", &["{a,b}"], &["a"]);
    }

    #[test]
    fn empty_alternatives_follow_globset() {
        // An empty alternative is dropped unless all are empty.
        check("x{,y}", &["xy"], &["x", ""]);
        check("x{y,}", &["xy"], &["x"]);
        check("x{,}", &["x"], &["xy", ""]);
        check("x{}", &["x"], &["x{}", ""]);
        check("{}", &[""], &["a"]);
        check("x{{},y}", &["xy"], &["x"]);
        check("x{{,},y}", &["xy"], &["x"]);
        check("x{{}a,b}", &["xa", "xb"], &["x"]);
        check("a{}*{,}b", &["ab", "axb"], &["a"]);
    }

    #[test]
    fn alternation_errors() {
        assert_eq!(both_refuse("{a"), GlobError::UnclosedAlternation { at: 0 });
        assert_eq!(
            both_refuse("x{a,{b}"),
            GlobError::UnclosedAlternation { at: 1 }
        );
        assert_eq!(
            both_refuse("{a{b"),
            GlobError::UnclosedAlternation { at: 2 }
        );
        assert_eq!(
            both_refuse("{a").to_string(),
            "unclosed alternation `{` at 0"
        );
        assert_eq!(both_refuse("a,b}"), GlobError::UnmatchedClose { at: 3 });
        assert_eq!(both_refuse("{a,b}}"), GlobError::UnmatchedClose { at: 5 });
        assert_eq!(both_refuse("{a,b}}").to_string(), "unmatched `}` at 5");
        // Braces inside a class do not count.
        check("{[}]}", &["}"], &["{"]);
        assert_eq!(both_refuse("{[}"), GlobError::UnclosedClass { at: 1 });
    }

    #[test]
    fn nesting_is_limited_like_globset() {
        let ok = format!("{}a{}", "{".repeat(MAX_NESTING), "}".repeat(MAX_NESTING));
        check(&ok, &["a"], &["", "aa"]);
        let deep = format!(
            "{}a{}",
            "{".repeat(MAX_NESTING + 1),
            "}".repeat(MAX_NESTING + 1)
        );
        assert_eq!(
            both_refuse(&deep),
            GlobError::TooDeeplyNested { at: MAX_NESTING }
        );
    }

    #[test]
    fn expansion_is_capped() {
        // 2^8 = 256 alternatives: accepted.
        let ok = "{a,b}".repeat(8);
        check(&ok, &["abababab", "bbbbbbbb"], &["abababa", "abababac"]);
        // 2^9 = 512: refused here (difference 3), accepted by globset.
        let big = "{a,b}".repeat(9);
        assert!(theirs(&big).is_ok());
        assert_eq!(err(&big), GlobError::TooManyAlternatives);
        assert!(err(&big).to_string().contains("256"), "{}", err(&big));
        // Within one group, too.
        let wide = format!("{{{}}}", vec!["a"; 257].join(","));
        assert_eq!(err(&wide), GlobError::TooManyAlternatives);
        // Empty alternatives do not count.
        let empties = format!("x{}", "{,,,,,,,,,}".repeat(20));
        check(&empties, &["x"], &["xx"]);
    }

    #[test]
    fn escapes() {
        check(r"\*", &["*"], &["a", ""]);
        check(r"a\?", &["a?"], &["ab"]);
        check(r"\[a]", &["[a]"], &["a"]);
        check(r"\\", &["\\"], &[""]);
        check(r"\a\/", &["a/"], &[]);
        check(r"*\**", &["*", "a*b"], &["ab"]);
        assert_eq!(both_refuse("ab\\"), GlobError::DanglingEscape);
        assert_eq!(both_refuse("\\"), GlobError::DanglingEscape);
        assert_eq!(
            GlobError::DanglingEscape.to_string(),
            "dangling `\\` at end"
        );
        assert_eq!(both_refuse("{a\\"), GlobError::DanglingEscape);
    }

    #[test]
    fn no_exponential_backtracking() {
        // at the MAX_NAME_BYTES cap (longer names match no glob)
        let name = "a".repeat(MAX_NAME_BYTES);
        assert!(!glob("*a*a*a*a*a*b").is_match(&name));
        assert!(glob("*a*a*a*a*a*").is_match(&name));
        assert!(!glob("{*a,*b}*a*a*a*a*a*b{x,y}").is_match(&name));
        let long = format!("{}b", "a".repeat(MAX_NAME_BYTES - 1));
        assert!(glob("*a*a*a*a*a*b").is_match(&long));
        assert!(!glob("*?*?*?*?*?*?*?*c").is_match(&long));
    }

    /// A name over MAX_NAME_BYTES matches no glob, `*` included; one at the cap does.
    #[test]
    fn a_name_over_the_cap_matches_no_glob() {
        let at_cap = format!("{}render", "x".repeat(MAX_NAME_BYTES - 6));
        assert!(glob("*render*").is_match(&at_cap));
        assert!(glob("*").is_match(&at_cap));
        let over = format!("x{at_cap}");
        assert!(!glob("*render*").is_match(&over));
        assert!(!glob("*").is_match(&over));
        assert!(!glob("*[r]ender*").is_match(&over));
        assert!(!GlobSet::new(vec![glob("*"), glob("x*")]).is_match(&over));
    }

    /// A name of megabytes (an exporter may send any `gen_ai.tool.name`) against the
    /// default class globs and a rule: answered by a substring search per literal run, not
    /// a character-by-character scan per glob (which stalled the watchdog for seconds).
    #[test]
    fn a_name_of_megabytes_is_matched_in_one_pass() {
        // the matchers themselves, below the MAX_NAME_BYTES cap of `Glob::is_match`
        let m = |g: &Glob, n: &str| g.alternatives.iter().any(|a| a.is_match(n));
        let mut name = "x".repeat(8 << 20);
        let globs: Vec<Glob> = crate::config::DEFAULT_CLASS_GLOBS
            .iter()
            .map(|g| glob(g))
            .chain([glob("run_*_x"), glob("x*y*z")])
            .collect();
        assert!(globs.iter().all(|g| g.alternatives[0].runs.is_some()));
        assert!(globs.iter().all(|g| !m(g, &name)));
        name.insert_str(4 << 20, "render");
        assert!(m(&globs[0], &name), "{:?}", globs[0]);
        let name = format!("run_{}_x", "é".repeat(1 << 20));
        assert!(m(&glob("run_*_x"), &name));
        assert!(!m(&glob("run_*_y"), &name));
        // a class makes it the token matcher, still linear for one star
        let g = glob("*[r]ender*");
        assert!(g.alternatives[0].runs.is_none());
        assert!(!m(&g, &"x".repeat(1 << 20)));
    }

    #[test]
    fn literal_runs_take_prefix_suffix_and_leftmost_middles() {
        let runs = |p: &str| glob(p).alternatives[0].runs.clone().unwrap();
        let m = |p: &str, n: &str| match_literal_runs(&runs(p), n.as_bytes());
        assert!(!m("ab*ba", "aba") && m("ab*ba", "abba"));
        assert!(m("a*a*a", "aaa") && !m("a*a*a", "aa"));
        assert!(m("*", "") && m("**", "x/y") && m("", "") && !m("", "x"));
        assert!(m("*ab*ab*", "xabab") && !m("*ab*ab*", "xaba"));
        assert!(m("é*é", "éé") && !m("é*é", "é"));
    }

    #[test]
    fn long_globs_and_large_expansions_are_refused() {
        let e = err(&"a".repeat(MAX_GLOB_BYTES + 1));
        assert_eq!(
            e,
            GlobError::TooLong {
                len: MAX_GLOB_BYTES + 1
            }
        );
        assert!(e.to_string().contains("over the limit of 4096"), "{e}");
        glob(&"a".repeat(MAX_GLOB_BYTES));
        // 256 alternatives of ~3,000 characters each: over MAX_TOKENS
        let p = format!("{}{}", "x".repeat(3000), "{a,b}".repeat(8));
        assert_eq!(err(&p), GlobError::TooManyAlternatives);
        let p = format!("{}{}", "{a,b}".repeat(8), "x".repeat(3000));
        assert_eq!(err(&p), GlobError::TooManyAlternatives);
        // 256 short alternatives stay accepted
        glob(&format!("tool_{}", "{a,b}".repeat(8)));
    }

    #[test]
    fn glob_set() {
        let set: GlobSet = ["*render*", "run_{a,b}"].iter().map(|p| glob(p)).collect();
        assert_eq!(set.len(), 2);
        assert!(set.is_match("x_render") && set.is_match("run_b"));
        assert!(!set.is_match("run_c"));
        let empty = GlobSet::empty();
        assert!(empty.is_empty());
        assert!(!empty.is_match("") && !empty.is_match("a"));
        assert_eq!(glob("a*").as_str(), "a*");
        assert_eq!(glob("a*").to_string(), "a*");
        assert_eq!(format!("{:?}", glob("a*")), "Glob(\"a*\")");
    }

    // ---- Property tests against globset ----

    /// Whether globset may give a `**` in `p` a path meaning (difference 1): some `**`
    /// starts `p` or follows `/`, `{` or `,` (escaped or not, in a class or not: erring
    /// towards skipping).
    fn globset_may_read_recursive(p: &str) -> bool {
        let b = p.as_bytes();
        (0..b.len().saturating_sub(1)).any(|i| {
            b[i] == b'*' && b[i + 1] == b'*' && (i == 0 || matches!(b[i - 1], b'/' | b'{' | b','))
        })
    }

    /// Random glob text over the characters that matter, most of it not a valid glob.
    fn soup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => Just("a"),
            2 => Just("b"),
            2 => Just("/"),
            3 => Just("*"),
            2 => Just("?"),
            2 => Just("["),
            2 => Just("]"),
            1 => Just("!"),
            1 => Just("^"),
            2 => Just("-"),
            2 => Just("{"),
            2 => Just("}"),
            2 => Just(","),
            1 => Just("\\"),
            1 => Just("\\a"),
            1 => Just("\\*"),
            1 => Just("\\["),
            1 => Just("\\]"),
            1 => Just("\\{"),
            1 => Just("\\}"),
            1 => Just("\\,"),
            1 => Just("\\-"),
            1 => Just("\\\\"),
        ];
        prop::collection::vec(piece, 0..14).prop_map(|v| v.concat())
    }

    /// Random valid-looking globs: sequences of literals, escapes, `*`, `?`, classes and
    /// nested groups.
    fn structured() -> impl Strategy<Value = String> {
        let class_member = prop_oneof![
            Just("a"),
            Just("b"),
            Just("-"),
            Just("/"),
            Just("*"),
            Just("!"),
            Just("^"),
            Just("]"),
            Just("a-b"),
            Just("--a"),
            Just("\\"),
            Just("{"),
            Just(","),
        ];
        let class = (
            prop_oneof![Just(""), Just("!"), Just("^")],
            prop::collection::vec(class_member, 1..4),
        )
            .prop_map(|(neg, members)| format!("[{neg}{}]", members.concat()));
        let literal = prop::sample::select(&["a", "b", "/", "-", "!", "]", "^"][..]);
        let star_or_any = prop::sample::select(&["*", "**", "?"][..]);
        let escape = prop::sample::select(&["\\*", "\\a", "\\{", "\\,", "\\\\", "\\/"][..]);
        let leaf = prop_oneof![
            4 => literal.prop_map(String::from),
            4 => star_or_any.prop_map(String::from),
            1 => escape.prop_map(String::from),
            2 => class,
            1 => Just(",".to_string()),
        ];
        let seq = |inner: BoxedStrategy<String>| {
            prop::collection::vec(inner, 0..5).prop_map(|v| v.concat())
        };
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                3 => seq(inner.clone().boxed()),
                2 => prop::collection::vec(seq(inner.boxed()), 1..4)
                    .prop_map(|alts| format!("{{{}}}", alts.join(","))),
            ]
        })
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        let c = prop_oneof![
            4 => Just('a'),
            3 => Just('b'),
            2 => Just('/'),
            1 => Just('-'),
            1 => Just('*'),
        ];
        let name = prop::collection::vec(c, 0..9).prop_map(|v| v.into_iter().collect::<String>());
        prop::collection::vec(name, 24)
    }

    /// Names that `g` matches, one per alternative (characters for `?`, `*` and classes
    /// picked by `seed`), each with near misses: its last character dropped, an `a`
    /// appended, a `/` prepended.
    fn witnesses(g: &Glob, seed: u64) -> Vec<String> {
        const CHARS: &[char] = &[
            'a', 'b', '/', '-', '*', ']', '!', '^', ',', '{', '}', '\\', '[', '?', 'z',
        ];
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        let mut out = Vec::new();
        'alternatives: for alt in &g.alternatives {
            let mut w = String::new();
            for t in &alt.tokens {
                match t {
                    Token::Literal(c) => w.push(*c),
                    Token::Star => {
                        for _ in 0..next() % 3 {
                            w.push(CHARS[next() % CHARS.len()]);
                        }
                    }
                    t => {
                        let fits: Vec<char> =
                            CHARS.iter().copied().filter(|&c| t.matches(c)).collect();
                        if fits.is_empty() {
                            continue 'alternatives;
                        }
                        w.push(fits[next() % fits.len()]);
                    }
                }
            }
            assert!(g.is_match(&w), "{g:?} does not match its witness {w:?}");
            let mut shorter = w.clone();
            shorter.pop();
            out.extend([format!("{w}a"), format!("/{w}"), shorter, w]);
        }
        out
    }

    /// The property: where globset accepts `p` we do too (but for difference 3), where it
    /// refuses we refuse, and where both accept (and difference 1 cannot apply) the random
    /// `names` and our glob's witnesses (see [`witnesses`]) match alike.
    fn agrees_with_globset(p: &str, names: &[String], seed: u64) -> Result<(), TestCaseError> {
        let ours = Glob::new(p);
        match (&ours, theirs(p)) {
            (Ok(_), Err(e)) => {
                return Err(TestCaseError::fail(format!(
                    "{p:?}: accepted here, globset refused: {e}"
                )))
            }
            (Err(GlobError::TooManyAlternatives), Ok(_)) => {}
            (Err(e), Ok(_)) => {
                return Err(TestCaseError::fail(format!(
                    "{p:?}: refused here ({e}), globset accepted"
                )))
            }
            (Err(_), Err(_)) => {}
            (Ok(g), Ok(m)) => {
                // the literal fast path answers as the token matcher does, for every glob
                for n in names.iter().cloned().chain(witnesses(g, seed)) {
                    for alt in &g.alternatives {
                        if let Some(runs) = &alt.runs {
                            prop_assert_eq!(
                                match_literal_runs(runs, n.as_bytes()),
                                match_tokens(&alt.tokens, &n),
                                "fast path: glob {:?} name {:?}",
                                p,
                                n
                            );
                        }
                    }
                }
                if !globset_may_read_recursive(p) {
                    for n in names.iter().cloned().chain(witnesses(g, seed)) {
                        prop_assert_eq!(
                            g.is_match(&n),
                            m.is_match(&n),
                            "glob {:?} name {:?}",
                            p,
                            n
                        );
                    }
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn soup_agrees_with_globset(p in soup(), names in names(), seed: u64) {
            agrees_with_globset(&p, &names, seed)?;
        }

        #[test]
        fn structured_agrees_with_globset(p in structured(), names in names(), seed: u64) {
            agrees_with_globset(&p, &names, seed)?;
        }

        #[test]
        fn set_agrees_with_globset(
            ps in prop::collection::vec(structured(), 0..4),
            names in names(),
        ) {
            let ours: Result<Vec<Glob>, _> = ps.iter().map(|p| Glob::new(p)).collect();
            let mut b = globset::GlobSetBuilder::new();
            let mut gs_ok = true;
            for p in &ps {
                match globset::GlobBuilder::new(p).backslash_escape(true).build() {
                    Ok(g) => {
                        b.add(g);
                    }
                    Err(_) => gs_ok = false,
                }
            }
            if let (Ok(ours), true) = (ours, gs_ok) {
                if !ps.iter().any(|p| globset_may_read_recursive(p)) {
                    let ours = GlobSet::new(ours);
                    let theirs = b.build().unwrap();
                    for n in &names {
                        prop_assert_eq!(
                            ours.is_match(n),
                            theirs.is_match(n),
                            "globs {:?} name {:?}",
                            ps,
                            n
                        );
                    }
                }
            }
        }
    }
}
