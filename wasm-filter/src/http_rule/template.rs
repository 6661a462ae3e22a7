//! Path templates: parsing `google.api.http` patterns, matching request
//! paths to them, and the path's own escaping rules (what a variable's
//! text is once unescaped, and how the proxy's decoded path is read).
//!
//! Grammar (from google/api/http.proto's documentation):
//! `Template = "/" Segments [ ":" Verb ]`, `Segment = "*" | "**" | LITERAL |
//! Variable`, `Variable = "{" FieldPath [ "=" Segments ] "}"`.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Segment {
    Literal(String),
    /// `*`: exactly one segment.
    Single,
    /// `**`: the rest of the path.
    Multi,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Variable {
    field_path: Vec<String>,
    /// Template segments [start, end) that the variable covers.
    start: usize,
    end: usize,
}

/// A parameter of a template's OpenAPI path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathParam {
    pub name: String,
    /// The request field it fills (empty for a wildcard outside any
    /// variable).
    pub field_path: Vec<String>,
    /// The field's whole value, or one segment of it.
    pub whole: bool,
    /// It stands for `**`: the rest of the path, slashes included.
    pub rest: bool,
}

impl PathParam {
    fn whole(name: String, field_path: &[String]) -> Self {
        PathParam {
            name,
            field_path: field_path.to_vec(),
            whole: true,
            rest: false,
        }
    }

    fn part(name: String, field_path: &[String], segment: &Segment) -> Self {
        PathParam {
            name,
            field_path: field_path.to_vec(),
            whole: false,
            rest: *segment == Segment::Multi,
        }
    }
}

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
    variables: Vec<Variable>,
    verb: Option<String>,
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let err = |why: &str| format!("invalid path template '{text}': {why}");
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| err("must start with '/'"))?;
        let (body, verb) = split_verb(rest);
        if verb == Some("") {
            return Err(err("a ':' must be followed by a verb"));
        }
        let mut template = Template {
            segments: Vec::new(),
            variables: Vec::new(),
            verb: verb.map(str::to_string),
        };
        // `/` alone (or `/:verb`) is the root: no segments.
        if body.is_empty() {
            return Ok(template);
        }
        let mut i = 0;
        let chars: Vec<char> = body.chars().collect();
        while i <= chars.len() {
            if chars.get(i) == Some(&'{') {
                let close = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| err("unclosed '{'"))?
                    + i;
                let inner: String = chars[i + 1..close].iter().collect();
                template.variable(&inner).map_err(|e| err(&e))?;
                i = close + 1;
            } else {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '/')
                    .map_or(chars.len(), |p| p + i);
                let segment: String = chars[i..end].iter().collect();
                template
                    .segments
                    .push(literal_or_wildcard(&segment).map_err(|e| err(&e))?);
                i = end;
            }
            match chars.get(i) {
                Some('/') => i += 1,
                None => break,
                Some(c) => return Err(err(&format!("unexpected '{c}'"))),
            }
        }
        let multi = template.segments.iter().position(|s| *s == Segment::Multi);
        if multi.is_some_and(|m| m + 1 != template.segments.len()) {
            return Err(err("'**' must be the last segment"));
        }
        Ok(template)
    }

    fn variable(&mut self, inner: &str) -> Result<(), String> {
        let (path, pattern) = inner.split_once('=').unwrap_or((inner, "*"));
        if path.is_empty() || pattern.contains('{') {
            return Err("bad variable".into());
        }
        let start = self.segments.len();
        for segment in pattern.split('/') {
            self.segments.push(literal_or_wildcard(segment)?);
        }
        let field_path = path.split('.').map(str::to_string).collect();
        self.variables.push(Variable {
            field_path,
            start,
            end: self.segments.len(),
        });
        Ok(())
    }

    /// The custom verb the template ends with (`:move`), if any.
    pub fn verb(&self) -> Option<&str> {
        self.verb.as_deref()
    }

    /// The variable bindings when `path` (without the query) matches.
    pub fn matches(&self, path: &str) -> Option<PathVars> {
        self.matches_verb(path, true, UrlUnescape::default())
    }

    /// [`Template::matches`], where `verb` says whether a `:verb` ending
    /// the path is one (see [`RequestPath::parse`]). `unescape` says which
    /// escapes a variable of several segments keeps.
    pub fn matches_verb(&self, path: &str, verb: bool, unescape: UrlUnescape) -> Option<PathVars> {
        let request = RequestPath::parse(path, verb)?;
        let spans = self.spans(&request)?;
        self.bind(&request, &spans, unescape).ok()
    }

    /// For each template segment, the request segments it takes, when the
    /// template matches `request`. As in Envoy's path matcher, segments are
    /// compared raw (undecoded), `*` takes any one segment (an empty one of
    /// `//` too) and a final `**` the rest, none included.
    pub fn spans(&self, request: &RequestPath) -> Option<Vec<(usize, usize)>> {
        if request.verb != self.verb.as_deref() {
            return None;
        }
        self.spans_of(&request.parts)
    }

    /// [`Template::spans`] for the request's segments alone, its verb aside.
    pub(super) fn spans_of(&self, parts: &[&str]) -> Option<Vec<(usize, usize)>> {
        let mut spans = Vec::with_capacity(self.segments.len());
        let mut at = 0;
        for segment in &self.segments {
            match segment {
                Segment::Literal(l) if parts.get(at) == Some(&l.as_str()) => {
                    spans.push((at, at + 1));
                    at += 1;
                }
                Segment::Single if at < parts.len() => {
                    spans.push((at, at + 1));
                    at += 1;
                }
                Segment::Multi => {
                    spans.push((at, parts.len()));
                    at = parts.len();
                }
                _ => return None,
            }
        }
        (at == parts.len()).then_some(spans)
    }

    /// The variables' values in a request that [`Template::spans`] matched.
    /// A variable whose escapes decode to bytes that are not UTF-8 is
    /// refused, naming it.
    pub fn bind(
        &self,
        request: &RequestPath,
        spans: &[(usize, usize)],
        unescape: UrlUnescape,
    ) -> Result<PathVars, String> {
        let bindings = self.variables.iter().map(|v| {
            let (from, to) = (spans[v.start].0, spans[v.end - 1].1);
            // One segment is unescaped whole, as http.proto and Envoy do;
            // a `**` is several even where it takes one (Envoy's rule).
            let several = to - from > 1
                || self.segments[v.start..v.end]
                    .iter()
                    .any(|s| matches!(s, Segment::Multi));
            let unescape = if several {
                unescape
            } else {
                UrlUnescape::AllCharacters
            };
            let value = request.parts[from..to]
                .iter()
                .map(|p| percent_decode_value(p, unescape))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    format!(
                        "path variable '{}': its escapes decode to bytes that are not UTF-8",
                        v.field_path.join(".")
                    )
                })?
                .join("/");
            Ok((v.field_path.clone(), value))
        });
        bindings.collect()
    }

    /// The template as an OpenAPI path, and its parameters in order: a
    /// variable of one segment is `{field_path}` (its names joined by `_`:
    /// tools read a dot as an attribute); a variable over several
    /// segments is written out, its literals as they are and each
    /// wildcard a parameter of its own (`{name=shelves/*}` is
    /// `shelves/{name_1}`), since a path parameter holds no `/`; a
    /// wildcard outside any variable is `{_k}`.
    pub fn openapi_path(&self) -> (String, Vec<PathParam>) {
        let mut path = String::new();
        let mut params = Vec::new();
        let mut at = 0;
        while at < self.segments.len() {
            let variable = self.variables.iter().find(|v| v.start == at);
            match variable {
                Some(v) if v.end == v.start + 1 && self.segments[at] == Segment::Single => {
                    // `_`, not `.`: tools read `{a.b}` as an attribute.
                    let name = v.field_path.join("_");
                    path.push_str(&format!("/{{{name}}}"));
                    params.push(PathParam::whole(name, &v.field_path));
                    at += 1;
                }
                Some(v) => {
                    let field = v.field_path.join("_");
                    let mut k = 0;
                    for segment in &self.segments[v.start..v.end] {
                        path.push('/');
                        match segment {
                            Segment::Literal(literal) => path.push_str(literal),
                            wildcard => {
                                k += 1;
                                let name = format!("{field}_{k}");
                                path.push_str(&format!("{{{name}}}"));
                                params.push(PathParam::part(name, &v.field_path, wildcard));
                            }
                        }
                    }
                    at = v.end;
                }
                None => {
                    path.push('/');
                    match &self.segments[at] {
                        Segment::Literal(literal) => path.push_str(literal),
                        wildcard => {
                            let name = format!("_{}", at + 1);
                            path.push_str(&format!("{{{name}}}"));
                            params.push(PathParam::part(name, &[], wildcard));
                        }
                    }
                    at += 1;
                }
            }
        }
        if path.is_empty() {
            path.push('/');
        }
        if let Some(verb) = &self.verb {
            path.push(':');
            path.push_str(verb);
        }
        (path, params)
    }

    /// The template with its variables as the segments they match
    /// (`/v1/users/*`): two templates of one shape match the same paths.
    pub fn shape(&self) -> String {
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            out.push_str(match segment {
                Segment::Literal(l) => l,
                Segment::Single => "*",
                Segment::Multi => "**",
            });
        }
        if out.is_empty() {
            out.push('/');
        }
        if let Some(verb) = &self.verb {
            out.push(':');
            out.push_str(verb);
        }
        out
    }

    /// How Envoy's path matcher orders templates that match one path: it
    /// walks a tree of segments trying a literal before `*` and `*` before
    /// `**`, and backtracks, so the template whose segment kinds come
    /// first, segment by segment, wins; one that ends where another goes
    /// on (with a `**` taking nothing) comes first. Where two are equal,
    /// they are the same path in that tree.
    pub fn precedence(&self, other: &Template) -> std::cmp::Ordering {
        let rank = |s: &Segment| match s {
            Segment::Literal(_) => 0,
            Segment::Single => 1,
            Segment::Multi => 2,
        };
        let mine = self.segments.iter().map(rank);
        mine.cmp(other.segments.iter().map(rank))
    }
}

/// A request path as Envoy's path matcher splits it: its segments, and its
/// custom verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    pub(super) parts: Vec<&'a str>,
    verb: Option<&'a str>,
}

impl<'a> RequestPath<'a> {
    /// `path` without its query. `verb` says whether a `:verb` ending the
    /// path is one: a verb that no binding registers is path text, as in
    /// Envoy (`/v1/{name}` takes `/v1/a:b` whole). Trailing `/`s are
    /// dropped (`/v1/shelves/` is `/v1/shelves`), as Envoy drops them.
    pub fn parse(path: &'a str, verb: bool) -> Option<RequestPath<'a>> {
        let rest = path.strip_prefix('/')?;
        let (body, verb) = if verb { split_verb(rest) } else { (rest, None) };
        let body = body.trim_end_matches('/');
        let parts = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        Some(RequestPath { parts, verb })
    }
}

/// The `:verb` a request path ends with, if any.
pub fn path_verb(path: &str) -> Option<&str> {
    split_verb(path.strip_prefix('/')?).1
}

/// The verb is what follows the last ':' of the last segment.
pub(super) fn split_verb(path: &str) -> (&str, Option<&str>) {
    let last = path.rfind('/').map_or(0, |i| i + 1);
    match path[last..].rfind(':') {
        Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
        None => (path, None),
    }
}

pub(super) fn literal_or_wildcard(segment: &str) -> Result<Segment, String> {
    match segment {
        "*" => Ok(Segment::Single),
        "**" => Ok(Segment::Multi),
        "" => Err("empty segment".into()),
        s if s.contains(['{', '}', '*']) => Err(format!("bad segment '{s}'")),
        s => Ok(Segment::Literal(s.to_string())),
    }
}

/// Which `%XX` escapes of a variable of several segments stay as they
/// are: Envoy's `url_unescape_spec`, and its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UrlUnescape {
    /// The reserved characters of RFC 6570 (`!#$&'()*+,/:;=?@[]`) stay
    /// escaped.
    #[default]
    AllCharactersExceptReserved,
    /// Only `%2F` stays, as http.proto describes.
    AllCharactersExceptSlash,
    AllCharacters,
}

impl UrlUnescape {
    fn keeps(self, byte: u8) -> bool {
        match self {
            UrlUnescape::AllCharactersExceptReserved => b"!#$&'()*+,/:;=?@[]".contains(&byte),
            UrlUnescape::AllCharactersExceptSlash => byte == b'/',
            UrlUnescape::AllCharacters => false,
        }
    }
}

/// Whether `raw` (a path as the client sent it, with its query) is what
/// a host that decodes paths shows as `decoded`: the same path, nothing
/// rewritten in between, so that its escapes can be trusted.
/// Segment by segment: a `%2F` that nginx decoded into two segments (and
/// routed as two) must not become one here.
pub fn is_raw_form_of(raw: &str, decoded_path: &[u8], decoded_query: &str) -> bool {
    let (raw_path, raw_query) = raw.split_once('?').unwrap_or((raw, ""));
    raw_query == decoded_query
        && raw_path
            .split('/')
            .map(|segment| percent_decode_bytes(segment, UrlUnescape::AllCharacters))
            .eq(decoded_path.split(|&b| b == b'/').map(<[u8]>::to_vec))
}

/// A decoded path written back as one the bindings read the same way:
/// `%` and `?` escaped again, so that nothing is decoded twice and a `?`
/// nginx decoded does not start a query; a path that is not UTF-8 has its
/// other bytes escaped too, so that a variable holding them is refused by
/// name rather than the whole path lost.
pub fn escaped_again(decoded_path: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(decoded_path) {
        return text.replace('%', "%25").replace('?', "%3F");
    }
    let mut out = String::with_capacity(decoded_path.len() + 8);
    for &byte in decoded_path {
        if byte.is_ascii() && byte != b'%' && byte != b'?' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `%XX` escapes, but those `unescape` keeps; text that is not UTF-8
/// once decoded as U+FFFD, for looking names up.
pub(super) fn percent_decode(text: &str, unescape: UrlUnescape) -> String {
    String::from_utf8_lossy(&percent_decode_bytes(text, unescape)).into_owned()
}

/// [`percent_decode`] for a value: `None` when the escapes decode to
/// bytes that are not UTF-8, which no JSON value and no string field can
/// carry (Envoy's transcoder passes them on, for the upstream to refuse
/// the message; a U+FFFD would change the value unseen).
pub(super) fn percent_decode_value(text: &str, unescape: UrlUnescape) -> Option<String> {
    String::from_utf8(percent_decode_bytes(text, unescape)).ok()
}

pub(super) fn percent_decode_bytes(text: &str, unescape: UrlUnescape) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            // Two hex digits, as Envoy reads them (`from_str_radix` alone
            // would take `%+1`).
            let digits = &b[i + 1..i + 3];
            let hex = digits
                .iter()
                .all(u8::is_ascii_hexdigit)
                .then(|| std::str::from_utf8(digits).ok())
                .flatten()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(byte) = hex {
                if !unescape.keeps(byte) {
                    out.push(byte);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}
