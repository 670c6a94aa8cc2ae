//! Reading a policy file and checking what the types alone cannot: the problems that refuse
//! it and the warnings about settings that weaken the journal's proof.

use std::path::Path;

use super::adapter::{validate_grpc, validate_http};
use super::{
    ActionPolicy, AdapterConfig, MAX_RESULT_MAX_BYTES, Policy, PolicyError, ReconcilePolicy, result,
};
use crate::model::ActionType;

impl Policy {
    /// Reads, parses and validates a policy file.
    ///
    /// Errors: every problem found, each with the file, the line and the setting.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::single(&file, None, "", format!("cannot read: {e}")))?;
        Self::parse(&text, &file)
    }

    /// Parses and validates policy text; `file` names it in errors.
    ///
    /// Errors: every problem found, each with the file, the line and the setting.
    pub fn parse(text: &str, file: &str) -> Result<Self, PolicyError> {
        crate::policy_file::parse(text, file)
    }

    /// Like [`Policy::parse`], with the file's warnings ([`Policy::warnings`]) as a
    /// [`PolicyError`] whose problems are the warnings (empty when there are none).
    ///
    /// Errors: every problem found, each with the file, the line and the setting.
    pub fn parse_with_warnings(text: &str, file: &str) -> Result<(Self, PolicyError), PolicyError> {
        let (policy, warnings) = crate::policy_file::parse_with_warnings(text, file)?;
        Ok((
            policy,
            PolicyError {
                file: file.to_owned(),
                problems: warnings,
            },
        ))
    }

    /// Like [`Policy::load`], with the file's warnings (see [`Policy::parse_with_warnings`]).
    ///
    /// Errors: every problem found, each with the file, the line and the setting.
    pub fn load_with_warnings(path: &Path) -> Result<(Self, PolicyError), PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::single(&file, None, "", format!("cannot read: {e}")))?;
        Self::parse_with_warnings(&text, &file)
    }

    /// Checks what the types alone cannot; every problem names its setting as a path.
    pub(crate) fn problems(&self) -> Vec<(Vec<String>, String)> {
        let mut problems = Vec::new();
        let mut problem = |path: &[&str], message: &str| {
            problems.push((
                path.iter().map(|s| (*s).to_owned()).collect(),
                message.to_owned(),
            ));
        };
        if self.defaults.max_lease_seconds == 0 {
            problem(&["defaults", "max_lease_seconds"], "must be at least 1");
        }
        let entries = self
            .actions
            .iter()
            .map(|(name, action)| (vec!["actions", name.as_str()], Some(name), action))
            .chain(
                self.default_action
                    .iter()
                    .map(|a| (vec!["default_action"], None, a)),
            );
        for (path, name, action) in entries {
            self.action_problems(&path, name, action, &mut problem);
            self.reconcile_problems(&path, &action.reconcile, &mut problem);
        }
        if self
            .defaults
            .result_deny_fields
            .iter()
            .any(|name| result::normalize_field_name(name).is_empty())
        {
            problem(
                &["defaults", "result_deny_fields"],
                "names must not be empty",
            );
        }
        for (name, adapter) in &self.adapters {
            let result = match adapter {
                AdapterConfig::Http(http) => validate_http(http),
                AdapterConfig::Grpc(grpc) => validate_grpc(grpc),
                AdapterConfig::None => Ok(()),
            };
            if let Err((setting, message)) = result {
                problem(&["adapters", name.as_str(), setting], &message);
            }
        }
        problems
    }

    /// Settings that are allowed but weaken the journal's proof, each with its path and why:
    /// `absence_grace_seconds: 0` on an action whose adapter can prove absence, and an http
    /// adapter without `response.status_pointer` (any 2xx JSON object counts as succeeded).
    /// `check-config` prints them; the server and the reconciler log them at start.
    pub fn warnings(&self) -> Vec<(Vec<String>, String)> {
        let mut warnings = Vec::new();
        let entries = self
            .actions
            .iter()
            .map(|(name, action)| (vec!["actions".to_owned(), name.clone()], action))
            .chain(
                self.default_action
                    .iter()
                    .map(|a| (vec!["default_action".to_owned()], a)),
            );
        for (path, action) in entries {
            let proves_absence = self
                .adapter_for(action)
                .is_some_and(|(_, adapter)| adapter.can_prove_absence());
            if proves_absence && action.reconcile.absence_grace_seconds == 0 {
                let mut path = path;
                path.extend(["reconcile".to_owned(), "absence_grace_seconds".to_owned()]);
                warnings.push((
                    path,
                    "0 lets the first \"not found\" release the operation for another attempt, \
                     with no time for the provider's search to catch up with its writes; a search \
                     that lags behind gives a second effect"
                        .to_owned(),
                ));
            }
        }
        for (name, adapter) in &self.adapters {
            if let AdapterConfig::Http(http) = adapter
                && http.response.status_pointer.is_none()
            {
                warnings.push((
                    ["adapters", name.as_str(), "response", "status_pointer"]
                        .map(str::to_owned)
                        .to_vec(),
                    "is not set, so any 2xx JSON object the lookup gets counts as succeeded; \
                     set status_pointer and succeeded_values so that only a completed object does"
                        .to_owned(),
                ));
            }
            if let AdapterConfig::Http(http) = adapter
                && http.response.key_pointer.is_none()
            {
                warnings.push((
                    ["adapters", name.as_str(), "response", "key_pointer"]
                        .map(str::to_owned)
                        .to_vec(),
                    "is not set, so a found object is taken for this operation's outcome \
                     whichever key it is about (a wrong route's or another object's status \
                     settles the operation); set it to where the object names the key"
                        .to_owned(),
                ));
            }
        }
        warnings
    }

    /// The problems of the action at `path` (named `name` unless it is the default).
    fn action_problems<'a>(
        &self,
        path: &[&'a str],
        name: Option<&String>,
        action: &ActionPolicy,
        problem: &mut impl FnMut(&[&str], &str),
    ) {
        let at = |rest: &[&'a str]| [path, rest].concat();
        if let Some(name) = name
            && ActionType::parse(name).is_err()
        {
            problem(
                path,
                "not a valid action type name: 1-80 characters of [A-Za-z0-9._:-]",
            );
        }
        if let Some(states) = &action.terminal_states {
            let mut states: Vec<&str> = states.iter().map(String::as_str).collect();
            states.sort_unstable();
            if states != ["failed_final", "succeeded"] {
                problem(
                    &at(&["terminal_states"]),
                    "the terminal states are succeeded and failed_final",
                );
            }
        }
        if action.retention_days == 0 {
            problem(&at(&["retention_days"]), "must be at least 1");
        }
        if !action.retry.reuse_operation_key {
            problem(
                &at(&["retry", "reuse_operation_key"]),
                "must be true: a retry of the same intent reuses its key",
            );
        }
        if let Some(keep) = &action.result.keep
            && let Err(error) = result::validate_keep(keep)
        {
            problem(&at(&["result", "keep"]), &error.to_string());
        }
        if action
            .result
            .max_bytes
            .is_some_and(|n| n == 0 || n > MAX_RESULT_MAX_BYTES)
        {
            problem(
                &at(&["result", "max_bytes"]),
                &format!("must be 1 to {MAX_RESULT_MAX_BYTES}"),
            );
        }
    }

    /// The problems of an action's `reconcile` settings, the action at `path`.
    fn reconcile_problems<'a>(
        &self,
        path: &[&'a str],
        reconcile: &ReconcilePolicy,
        problem: &mut impl FnMut(&[&str], &str),
    ) {
        let at = |rest: &[&'a str]| [path, rest].concat();
        if reconcile.interval_seconds == 0 {
            problem(
                &at(&["reconcile", "interval_seconds"]),
                "must be at least 1",
            );
        }
        if reconcile.max_interval_seconds < reconcile.interval_seconds {
            problem(
                &at(&["reconcile", "max_interval_seconds"]),
                "must be at least interval_seconds",
            );
        }
        if !(1.0..=10.0).contains(&reconcile.backoff_multiplier) {
            problem(
                &at(&["reconcile", "backoff_multiplier"]),
                "must be from 1.0 to 10.0",
            );
        }
        if !(0.0..=1.0).contains(&reconcile.jitter) {
            problem(&at(&["reconcile", "jitter"]), "must be from 0.0 to 1.0");
        }
        if reconcile.adapter_kind.is_some() {
            problem(
                &at(&["reconcile", "adapter_kind"]),
                "is recorded by the journal with each operation, never set in the file",
            );
        }
        if let Some(adapter) = &reconcile.adapter
            && !self.adapters.contains_key(adapter)
        {
            problem(
                &at(&["reconcile", "adapter"]),
                &format!("no adapter named '{adapter}' in adapters"),
            );
        }
    }
}
