//! `${VAR}` interpolation, and errors that name the file, the line, the column and the field.

use std::path::{Path, PathBuf};

/// A job file that cannot be run, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFileError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (0 if unknown).
    pub line: usize,
    /// 1-based column (0 if unknown).
    pub column: usize,
    /// The field, e.g. `operator[1].input` (empty for syntax errors).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for JobFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // file:line:column, as compilers print it, so editors jump there; no position if unknown.
        match self.line {
            0 => write!(f, "{}: ", self.path.display())?,
            _ => write!(f, "{}:{}:{}: ", self.path.display(), self.line, self.column)?,
        }
        if !self.field.is_empty() {
            write!(f, "field `{}`: ", self.field)?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for JobFileError {}

/// Replace `${VAR}` and `${VAR:-default}` with the environment's value (or the default),
/// and `${file:PATH}` with the contents of a file (a secret: a password, a token; one line,
/// its final newline dropped; a relative path is from the job file's folder; written inside a
/// double-quoted string, whose escapes it gets: `\` and `"` in a password stay themselves); `$$` is a
/// literal `$`. An unset variable without a default, or a file that cannot be read, is an
/// error at its line and column (never quoting a file's contents). Substitution stays within
/// its line (a value with a newline is refused), so the lines of later errors still match the
/// file.
pub fn interpolate(path: &Path, text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, JobFileError> {
    let err = |line: usize, column: usize, message: String| JobFileError {
        path: path.to_owned(),
        line,
        column,
        field: String::new(),
        message,
    };
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let column = line.len() - rest.len() + at + 1;
            let after = &rest[at + 1..];
            if let Some(r) = after.strip_prefix('$') {
                out.push('$');
                rest = r;
                continue;
            }
            let Some(body) = after.strip_prefix('{') else {
                out.push('$');
                rest = after;
                continue;
            };
            let Some(end) = body.find('}') else {
                return Err(err(n + 1, column, "`${` without a closing `}`; write `$$` for a literal `$`".into()));
            };
            if let Some(file) = body[..end].strip_prefix("file:") {
                out.push_str(&read_secret_file(path, file, &|m| err(n + 1, column, m))?);
                rest = &body[end + 1..];
                continue;
            }
            let (name, default) = match body[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&body[..end], None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(err(
                    n + 1,
                    column,
                    format!("`${{{}}}` is not a variable name (letters, digits, _)", &body[..end]),
                ));
            }
            let value = match (env(name), default) {
                (Some(v), _) => v,
                (None, Some(d)) => d.to_owned(),
                (None, None) => {
                    return Err(err(
                        n + 1,
                        column,
                        format!("environment variable {name} is not set; set it, or write ${{{name}:-default}}"),
                    ));
                }
            };
            if value.contains('\n') {
                return Err(err(n + 1, column, format!("environment variable {name} holds a newline")));
            }
            out.push_str(&value);
            rest = &body[end + 1..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

/// The one line of a secret file named by `${file:PATH}` in the job file at `job`; `err`
/// places a message at the reference.
fn read_secret_file(job: &Path, file: &str, err: &dyn Fn(String) -> JobFileError) -> Result<String, JobFileError> {
    if file.is_empty() {
        return Err(err("`${file:}` names no file; write ${file:/path/to/secret}".into()));
    }
    let path = match Path::new(file) {
        p if p.is_absolute() => p.to_owned(),
        p => job.parent().unwrap_or(Path::new(".")).join(p),
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| err(format!("cannot read the file {}: {e}", path.display())))?;
    let line = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    if line.contains('\n') {
        return Err(err(format!(
            "the file {} holds more than one line (a secret file holds one value)",
            path.display()
        )));
    }
    Ok(line.replace('\\', "\\\\").replace('"', "\\\""))
}

#[derive(Debug)]
pub(crate) struct Loc<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

impl Loc<'_> {
    pub(crate) fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> JobFileError {
        let (line, column) = match span {
            Some(s) => {
                let before = &self.text[..s.start.min(self.text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
                (line, column)
            }
            None => (0, 0),
        };
        JobFileError { path: self.path.to_owned(), line, column, field: field.into(), message: message.into() }
    }
}

#[cfg(test)]
mod interpolation_tests {
    use super::*;

    fn run(text: &str) -> Result<String, JobFileError> {
        interpolate(Path::new("j.toml"), text, &|n| (n == "HOST").then(|| "kafka:9092".to_owned()))
    }

    /// Set variables, defaults, `$$`, and the errors with line and column.
    #[test]
    fn variables_defaults_and_errors() {
        assert_eq!(run("a = \"${HOST}\"\nb = \"${PORT:-80}\"\n").unwrap(), "a = \"kafka:9092\"\nb = \"80\"\n");
        assert_eq!(run("price = \"$$5 and $x\"").unwrap(), "price = \"$5 and $x\"");
        let e = run("a = 1\nb = \"${MISSING}\"\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 6));
        assert!(e.message.contains("MISSING is not set") && e.message.contains("${MISSING:-default}"), "{}", e.message);
        assert!(run("a = \"${HOST\"").unwrap_err().message.contains("closing"));
        assert!(run("a = \"${HO ST}\"").unwrap_err().message.contains("not a variable name"));
    }

    /// `${file:PATH}`: one line, its newline dropped, relative to the job file; errors name
    /// the file, never its contents.
    #[test]
    fn secrets_from_files() {
        let dir = std::env::temp_dir().join(format!("weir-secret-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "hunter2\n").unwrap();
        std::fs::write(dir.join("two"), "hunter2\nhunter3\n").unwrap();
        let job = dir.join("job.toml");
        let run = |text: &str| interpolate(&job, text, &|_| None);
        assert_eq!(run("p = \"${file:pw}\"").unwrap(), "p = \"hunter2\"");
        std::fs::write(dir.join("quoted"), "a\\b\"c\n").unwrap();
        assert_eq!(run("p = \"${file:quoted}\"").unwrap(), "p = \"a\\\\b\\\"c\"", "escaped for a basic string");
        let absolute = format!("p = \"${{file:{}}}\"", dir.join("pw").display());
        assert_eq!(run(&absolute).unwrap(), "p = \"hunter2\"");
        let e = run("a = 1\np = \"${file:two}\"").unwrap_err();
        assert_eq!((e.line, e.column), (2, 6));
        assert!(e.message.contains("more than one line") && !e.message.contains("hunter"), "{}", e.message);
        let e = run("p = \"${file:missing}\"").unwrap_err();
        assert!(e.message.contains("cannot read the file") && e.message.contains("missing"), "{}", e.message);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
