//! Reading a policy file so that every problem is reported at once, each with its line.
//!
//! Serde stops at the first error and, once a value is typed, forgets where it came from. So
//! the file is read in two steps: first into a tree of YAML nodes that remember their lines,
//! then each entry (the defaults, each action, each adapter) is typed on its own, with
//! `serde_path_to_error` saying which setting failed; the line is looked up in the tree. The
//! semantic checks (an adapter that does not exist, a bad range) run when every entry typed.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;

use super::policy::Policy;

/// One problem in a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyProblem {
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// The setting, as a dotted path such as `actions.create_payment.lease_seconds`.
    pub setting: String,
    /// What is wrong.
    pub message: String,
}

/// A policy file that cannot be used, with every problem found.
#[derive(Debug, Clone, thiserror::Error)]
pub struct PolicyError {
    /// The file.
    pub file: String,
    /// The problems, in file order.
    pub problems: Vec<PolicyProblem>,
}

impl PolicyError {
    /// An error with one problem.
    pub fn single(file: &str, line: Option<u64>, setting: &str, message: String) -> Self {
        Self {
            file: file.to_owned(),
            problems: vec![PolicyProblem {
                line,
                setting: setting.to_owned(),
                message,
            }],
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}", self.file)?;
            if let Some(line) = problem.line {
                write!(f, ":{line}")?;
            }
            if problem.setting.is_empty() {
                write!(f, ": {}", problem.message)?;
            } else {
                write!(f, ": {}: {}", problem.setting, problem.message)?;
            }
        }
        Ok(())
    }
}

/// A YAML node and the line it starts on.
#[derive(Debug)]
struct Node {
    line: u64,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Entries with the line of each key.
    Map(Vec<(String, u64, Node)>),
    Seq(Vec<Node>),
    Scalar(Value),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Kind>::deserialize(deserializer)?;
        Ok(Node {
            line: spanned.referenced.line(),
            kind: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::from(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Kind, E> {
        Ok(Kind::Scalar(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::String(v.to_owned())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Scalar(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Kind::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let line = key.referenced.line();
            entries.push((key.value, line, map.next_value::<Node>()?));
        }
        Ok(Kind::Map(entries))
    }
}

impl Node {
    fn to_json(&self) -> Value {
        match &self.kind {
            Kind::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
            Kind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Kind::Scalar(value) => value.clone(),
        }
    }

    fn entries(&self) -> impl Iterator<Item = (&String, &Node)> {
        let entries: &[(String, u64, Node)] = match &self.kind {
            Kind::Map(entries) => entries,
            _ => &[],
        };
        entries.iter().map(|(k, _, v)| (k, v))
    }

    /// The child at `key` and the line that names it (the key's line for a mapping).
    fn child(&self, key: &str) -> Option<(u64, &Node)> {
        match &self.kind {
            Kind::Map(entries) => entries
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, line, v)| (*line, v)),
            Kind::Seq(items) => key
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get(i))
                .map(|v| (v.line, v)),
            Kind::Scalar(_) => None,
        }
    }

    /// The line naming the deepest node along `path` that exists.
    fn line_of<'a>(&self, path: impl IntoIterator<Item = &'a str>) -> u64 {
        let (mut line, mut node) = (self.line, self);
        for segment in path {
            match node.child(segment) {
                Some((at, child)) => (line, node) = (at, child),
                None => break,
            }
        }
        line
    }
}

const TOP_LEVEL: &[&str] = &[
    "defaults",
    "default_action",
    "actions",
    "tool_policy",
    "adapters",
];

/// Types each top-level entry of `root` on its own, so one bad entry does not hide the
/// others; unknown settings are problems too.
fn check_entries(root: &Node, problems: &mut Vec<PolicyProblem>) {
    for (key, node) in root.entries() {
        let path = vec![key.clone()];
        match key.as_str() {
            "defaults" | "default_action" => {
                check_typed(root, &path, node, key, problems);
            }
            "actions" | "tool_policy" | "adapters" => {
                for (name, entry) in node.entries() {
                    let path = vec![key.clone(), name.clone()];
                    check_typed(root, &path, entry, key, problems);
                }
                if !matches!(node.kind, Kind::Map(_)) {
                    problems.push(problem(root, &path, "must be a mapping by name".into()));
                }
            }
            other => problems.push(problem(
                root,
                &path,
                format!(
                    "unknown setting '{other}'; expected one of {}",
                    TOP_LEVEL.join(", ")
                ),
            )),
        }
    }
}

/// Checks on the tree that every `reconcile.adapter` of an action names an adapter, so that
/// an unknown adapter is reported together with type errors elsewhere.
fn check_adapter_references(root: &Node, problems: &mut Vec<PolicyProblem>) {
    let adapters: Vec<&String> = root
        .child("adapters")
        .map(|(_, node)| node.entries().map(|(name, _)| name).collect())
        .unwrap_or_default();
    for section in ["actions", "tool_policy"] {
        let Some((_, actions)) = root.child(section) else {
            continue;
        };
        for (name, action) in actions.entries() {
            let reference = action
                .child("reconcile")
                .and_then(|(_, r)| r.child("adapter"))
                .and_then(|(_, a)| match &a.kind {
                    Kind::Scalar(Value::String(s)) => Some(s),
                    _ => None,
                });
            if let Some(adapter) = reference
                && !adapters.contains(&adapter)
            {
                let path: Vec<String> = [section, name, "reconcile", "adapter"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                problems.push(problem(
                    root,
                    &path,
                    format!("no adapter named '{adapter}' in adapters"),
                ));
            }
        }
    }
}

/// Parses and validates a policy; see [`Policy::parse`].
pub(super) fn parse(text: &str, file: &str) -> Result<Policy, PolicyError> {
    parse_with_warnings(text, file).map(|(policy, _)| policy)
}

/// Parses and validates a policy, with its warnings (see [`Policy::warnings`]), each with
/// its line and setting.
pub(super) fn parse_with_warnings(
    text: &str,
    file: &str,
) -> Result<(Policy, Vec<PolicyProblem>), PolicyError> {
    let root: Node = serde_saphyr::from_str(text)
        .map_err(|e| PolicyError::single(file, None, "", e.to_string()))?;
    let mut problems = Vec::new();
    if !matches!(root.kind, Kind::Map(_)) {
        problems.push(PolicyProblem {
            line: Some(root.line),
            setting: String::new(),
            message: "the policy must be a mapping with actions and adapters".into(),
        });
    }
    check_entries(&root, &mut problems);
    check_adapter_references(&root, &mut problems);
    problems.sort_by_key(|p| p.line);
    if root.child("actions").is_some() && root.child("tool_policy").is_some() {
        problems.push(problem(
            &root,
            &["tool_policy".to_owned()],
            "give either actions or tool_policy, not both".into(),
        ));
    }
    if !problems.is_empty() {
        return Err(PolicyError {
            file: file.to_owned(),
            problems,
        });
    }
    let policy: Policy = serde_json::from_value(root.to_json())
        .map_err(|e| PolicyError::single(file, None, "", e.to_string()))?;
    let problems: Vec<PolicyProblem> = policy
        .problems()
        .into_iter()
        .map(|(path, message)| {
            let path = resolve_alias(&root, path);
            problem(&root, &path, message)
        })
        .collect();
    if problems.is_empty() {
        let warnings = policy
            .warnings()
            .into_iter()
            .map(|(path, message)| {
                let path = resolve_alias(&root, path);
                problem(&root, &path, message)
            })
            .collect();
        let mut policy = policy;
        policy.record_adapter_kinds();
        Ok((policy, warnings))
    } else {
        Err(PolicyError {
            file: file.to_owned(),
            problems,
        })
    }
}

/// Types one entry of `section` and records its problem, if any.
fn check_typed(
    root: &Node,
    path: &[String],
    node: &Node,
    section: &str,
    out: &mut Vec<PolicyProblem>,
) {
    let value = node.to_json();
    let result = match section {
        "defaults" => typed::<super::policy::Defaults>(&value),
        "default_action" | "actions" | "tool_policy" => {
            typed::<super::policy::ActionPolicy>(&value)
        }
        _ => typed::<super::policy::AdapterConfig>(&value),
    };
    if let Err((inner, message)) = result {
        let full: Vec<String> = path.iter().cloned().chain(inner).collect();
        out.push(problem(root, &full, message));
    }
}

/// Types `value` as `T`; on failure, the path inside `value` and the message.
fn typed<T: DeserializeOwned>(value: &Value) -> Result<(), (Vec<String>, String)> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(_) => Ok(()),
        Err(error) => {
            let path = error
                .path()
                .iter()
                .filter_map(|segment| match segment {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                    _ => None,
                })
                .collect();
            Err((path, error.into_inner().to_string()))
        }
    }
}

/// Semantic checks name actions under `actions`; the file may call it `tool_policy`.
fn resolve_alias(root: &Node, mut path: Vec<String>) -> Vec<String> {
    if path.first().is_some_and(|p| p == "actions") && root.child("actions").is_none() {
        path[0] = "tool_policy".to_owned();
    }
    path
}

fn problem(root: &Node, path: &[String], message: String) -> PolicyProblem {
    PolicyProblem {
        line: Some(root.line_of(path.iter().map(String::as_str))),
        setting: path.join("."),
        message,
    }
}

/// The problems a text has, for tests of the diagnostics.
#[cfg(test)]
pub(crate) fn problems_of(text: &str) -> Vec<PolicyProblem> {
    parse(text, "policy.yaml")
        .err()
        .map(|e| e.problems)
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_with_its_line_and_setting() {
        let text = include_str!("../testdata/policy_with_problems.yaml");
        let problems = problems_of(text);
        let found: Vec<(Option<u64>, &str)> = problems
            .iter()
            .map(|p| (p.line, p.setting.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![
                (Some(3), "actions.create_payment.lease_seconds"),
                (Some(5), "actions.create_payment.reconcile.adapter"),
                (Some(10), "adapters.payments"),
            ],
            "{problems:?}"
        );
        assert!(problems[2].message.contains("url"), "{problems:?}");
        // With the types fixed, the unknown adapter is named with its line.
        let fixed = text.replace("thirty", "30").replace(
            "    timeout_seconds: 5\n",
            "    url: \"http://x/{provider_key}\"\n",
        );
        let problems = problems_of(&fixed);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, Some(5));
        assert_eq!(
            problems[0].setting,
            "actions.create_payment.reconcile.adapter"
        );
    }

    #[test]
    fn the_articles_tool_policy_is_accepted_as_written() {
        let text = "\
tool_policy:
  create_payment:
    operation_key: required
    retry:
      reuse_operation_key: true
      on_timeout: reconcile_before_retry
    terminal_states:
      - succeeded
      - failed_final
    unknown_after_seconds: 900
    on_unresolved: require_human_review

  send_email:
    operation_key: required
    retry:
      reuse_operation_key: true
      on_timeout: reconcile_before_retry
";
        let policy = Policy::parse(text, "policy.yaml").unwrap();
        assert_eq!(policy.actions.len(), 2);
        assert_eq!(
            policy.actions["create_payment"].unknown_after_seconds,
            Some(900)
        );
    }

    #[test]
    fn unknown_settings_and_wrong_terminal_states_are_named() {
        let problems = problems_of("polcy: {}\nactions:\n  a:\n    terminal_states: [succeeded]\n");
        let settings: Vec<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(settings, vec!["polcy"], "{problems:?}");
        let problems = problems_of("actions:\n  a:\n    terminal_states: [succeeded]\n");
        assert_eq!(problems[0].setting, "actions.a.terminal_states");
        assert_eq!(problems[0].line, Some(3));
    }
}
