//! The action policy: the article's `tool_policy`, one entry per action type.
//!
//! The rules for retries live here, in a deterministic layer, never in the model's hands:
//! the lease an action gets, whether a timeout must be reconciled before any retry, and which
//! provider adapter can look an operation up. Unknown settings are refused, so a typo never
//! silently weakens a rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::ActionType;
use super::result::{self, ResultRules};
use super::sensitive::KeyPattern;

mod adapter;
mod validation;

pub use super::policy_file::{PolicyError, PolicyProblem};
pub use adapter::{
    AdapterConfig, BodyMatch, GrpcAdapterConfig, HeaderFromEnv, HttpAdapterConfig,
    NOT_SERVED_STATUSES, ResponseMapping, URL_VARIABLES, UrlTemplateError, validate_http,
    validate_url_template,
};

/// Default lease length, in seconds.
pub const DEFAULT_LEASE_SECONDS: u32 = 30;
/// Default longest lease, in seconds.
pub const DEFAULT_MAX_LEASE_SECONDS: u32 = 3600;

/// A parsed and validated policy file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Settings shared by every action.
    #[serde(default)]
    pub defaults: Defaults,
    /// The policy for action types that are not listed; without it they are refused with
    /// `INVALID_ARGUMENT`, reason `ACTION_TYPE_NOT_CONFIGURED`.
    #[serde(default)]
    pub default_action: Option<ActionPolicy>,
    /// Per action type (the article's `tool_policy` is accepted as another name for it).
    #[serde(default, alias = "tool_policy")]
    pub actions: BTreeMap<String, ActionPolicy>,
    /// Provider adapters by name, referenced from `actions.*.reconcile.adapter`.
    #[serde(default)]
    pub adapters: BTreeMap<String, AdapterConfig>,
}

/// Settings shared by every action.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Lease length when neither the request nor the action sets one, in seconds.
    #[serde(default = "default_lease_seconds")]
    pub lease_seconds: u32,
    /// Longest lease any request may get, in seconds.
    #[serde(default = "default_max_lease_seconds")]
    pub max_lease_seconds: u32,
    /// Field names removed from every stored result at any depth, on top of the built-in
    /// list ([`result::BUILTIN_DENY_FIELDS`]); compared case-insensitively, ignoring `_`
    /// and `-`.
    #[serde(default)]
    pub result_deny_fields: Vec<String>,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            lease_seconds: DEFAULT_LEASE_SECONDS,
            max_lease_seconds: DEFAULT_MAX_LEASE_SECONDS,
            result_deny_fields: Vec::new(),
        }
    }
}

fn default_lease_seconds() -> u32 {
    DEFAULT_LEASE_SECONDS
}
fn default_max_lease_seconds() -> u32 {
    DEFAULT_MAX_LEASE_SECONDS
}

/// The rules for one action type.
///
/// `ActionPolicy::default()` equals an action written as `{}` in the policy file: the same
/// defaults as deserialization, so the built-in policy keeps terminal operations for
/// [`DEFAULT_RETENTION_DAYS`].
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ActionPolicy {
    /// Lease length for this action, in seconds; `defaults.lease_seconds` when absent.
    #[serde(default)]
    pub lease_seconds: Option<u32>,
    /// What a retry may do.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// How unknown outcomes are looked up.
    #[serde(default)]
    pub reconcile: ReconcilePolicy,
    /// How long an operation may stay unknown before `on_unresolved` applies, in seconds
    /// (the article's `unknown_after_seconds`); absent means never.
    #[serde(default)]
    pub unknown_after_seconds: Option<u32>,
    /// What happens to an operation still unknown after `unknown_after_seconds`.
    #[serde(default)]
    pub on_unresolved: OnUnresolved,
    /// The article's `operation_key: required`: an idempotency key is always required; this
    /// is the only accepted value.
    #[serde(default)]
    pub operation_key: KeyRequirement,
    /// The article's `terminal_states`: when given, must be `[succeeded, failed_final]`.
    #[serde(default)]
    pub terminal_states: Option<Vec<String>>,
    /// How long a terminal operation (and so its key) is kept, in days; a Begin with the key
    /// after that is a new operation. Default 35, above common provider deduplication
    /// windows (24 hours to 30 days).
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// What a Begin with a new key but the same request as a recent operation does.
    #[serde(default)]
    pub duplicate_intent: DuplicateIntentPolicy,
    /// A regular expression every new key of this action must match as a whole
    /// (`KEY_PATTERN_MISMATCH` otherwise); the check for personal data applies as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_pattern: Option<KeyPattern>,
    /// What of a result is stored.
    #[serde(default, skip_serializing_if = "ResultPolicy::is_unset")]
    pub result: ResultPolicy,
}

/// What of an action's results is stored (see [`crate::result`]).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResultPolicy {
    /// JSON Pointers of the fields to store, each stored under its last segment; an empty
    /// list stores no result. Absent: the whole result (minus denied fields) is stored, except
    /// that a result found by an http adapter is kept by that adapter's older
    /// `response.keep_fields`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Vec<String>>,
    /// Largest stored result, in bytes of canonical JSON (default 65536, at most 1048576).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
}

impl ResultPolicy {
    /// Whether nothing is set (then it is left out of the recorded policy).
    pub fn is_unset(&self) -> bool {
        self.keep.is_none() && self.max_bytes.is_none()
    }
}

/// Who reported a result, which decides the keep list when the action sets none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultSource<'a> {
    /// The lease holder (`CompleteOperation`) or a reviewer (`ResolveOperation`).
    Caller,
    /// The provider adapter of this name (in `adapters`), from the provider's answer.
    Adapter(&'a str),
}

/// The only accepted `operation_key` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRequirement {
    /// Every Begin carries an idempotency key.
    #[default]
    Required,
}

/// Default retention, in days.
pub const DEFAULT_RETENTION_DAYS: u32 = 35;

fn default_retention_days() -> u32 {
    DEFAULT_RETENTION_DAYS
}

/// Duplicate intent under a new key: the model invented a fresh key for a retry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DuplicateIntentPolicy {
    /// What to do.
    #[serde(default)]
    pub mode: DuplicateIntentMode,
    /// How far back a succeeded operation with the same request counts, in seconds
    /// (in-progress and unknown ones always count).
    #[serde(default = "default_duplicate_window")]
    pub window_seconds: u32,
}

impl Default for DuplicateIntentPolicy {
    fn default() -> Self {
        Self {
            mode: DuplicateIntentMode::default(),
            window_seconds: default_duplicate_window(),
        }
    }
}

fn default_duplicate_window() -> u32 {
    3600
}

/// What a suspected duplicate intent does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DuplicateIntentMode {
    /// Proceed without looking.
    #[default]
    Allow,
    /// Count it and log it (without the payload), then proceed.
    Warn,
    /// Answer `DECISION_DUPLICATE_INTENT_SUSPECTED` with the other operation's key; the caller
    /// proceeds only by sending `confirm_duplicate_intent`.
    Hold,
}

/// What happens to an operation that stays unknown too long (the article's `on_unresolved`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnresolved {
    /// Mark it for human review and stop looking it up automatically.
    #[default]
    RequireHumanReview,
    /// Keep looking it up at the maximum interval.
    KeepReconciling,
}

impl Default for ActionPolicy {
    fn default() -> Self {
        Self {
            lease_seconds: None,
            retry: RetryPolicy::default(),
            reconcile: ReconcilePolicy::default(),
            unknown_after_seconds: None,
            on_unresolved: OnUnresolved::default(),
            operation_key: KeyRequirement::default(),
            terminal_states: None,
            retention_days: DEFAULT_RETENTION_DAYS,
            duplicate_intent: DuplicateIntentPolicy::default(),
            key_pattern: None,
            result: ResultPolicy::default(),
        }
    }
}

impl ActionPolicy {
    /// Whether the provider deduplicates by our key, so that an unknown operation (or an
    /// expired lease) may be claimed again with the same key without reconciling first.
    pub fn provider_deduplicates(&self) -> bool {
        self.retry.on_timeout == OnTimeout::RetryWithSameKey
    }
}

/// The article's `retry` block.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Must be `true`: a retry of the same intent always reuses its key (article, step 1).
    #[serde(default = "yes")]
    pub reuse_operation_key: bool,
    /// What a timeout allows.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            reuse_operation_key: true,
            on_timeout: OnTimeout::default(),
        }
    }
}

fn yes() -> bool {
    true
}

/// What a timeout allows (the article's `on_timeout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Unknown stays unknown until the provider is asked (the safe default).
    #[default]
    ReconcileBeforeRetry,
    /// The provider deduplicates by our idempotency key, so a retry with the same key is safe.
    RetryWithSameKey,
}

/// When and how the reconcile path looks an unknown operation up.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReconcilePolicy {
    /// Name of an entry in `adapters`; absent means no lookup is possible.
    #[serde(default)]
    pub adapter: Option<String>,
    /// Delay before the first lookup after an unknown outcome, in seconds.
    #[serde(default = "default_first_check")]
    pub first_check_after_seconds: u32,
    /// Delay after the first lookup, in seconds; each later delay is multiplied by
    /// `backoff_multiplier`, up to `max_interval_seconds`, with +/- `jitter` spread.
    #[serde(default = "default_interval")]
    pub interval_seconds: u32,
    /// Longest delay between lookups, in seconds.
    #[serde(default = "default_max_interval")]
    pub max_interval_seconds: u32,
    /// Growth factor of the delay between lookups (1.0 to 10.0).
    #[serde(default = "default_multiplier")]
    pub backoff_multiplier: f64,
    /// Random spread of each delay, as a fraction (0.0 to 1.0): 0.2 means +/-20 %.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// How long after the outcome became unknown "not found" may still change (indexing lag), in
    /// seconds; absence counts as definitive only after it, and only from a complete search.
    #[serde(default = "default_grace")]
    pub absence_grace_seconds: u32,
    /// The kind of `adapter` when the operation was registered, recorded with the operation
    /// (never written in a policy file): an operation registered under a `kind: none` adapter
    /// is never looked up, whatever a later file says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_kind: Option<AdapterKind>,
}

/// What an adapter can do, as recorded with an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterKind {
    /// `kind: http`: a lookup.
    Http,
    /// `kind: grpc`: a lookup.
    Grpc,
    /// `kind: none`: no lookup; unknown goes to review.
    None,
}

impl AdapterKind {
    /// Whether an adapter of this kind looks operations up.
    pub fn looks_up(self) -> bool {
        !matches!(self, Self::None)
    }
}

impl Default for ReconcilePolicy {
    fn default() -> Self {
        Self {
            adapter: None,
            first_check_after_seconds: default_first_check(),
            interval_seconds: default_interval(),
            max_interval_seconds: default_max_interval(),
            backoff_multiplier: default_multiplier(),
            jitter: default_jitter(),
            absence_grace_seconds: default_grace(),
            adapter_kind: None,
        }
    }
}

fn default_first_check() -> u32 {
    5
}
fn default_interval() -> u32 {
    30
}
fn default_grace() -> u32 {
    300
}
fn default_max_interval() -> u32 {
    3600
}
fn default_multiplier() -> f64 {
    2.0
}
fn default_jitter() -> f64 {
    0.2
}

impl ReconcilePolicy {
    /// Delay before lookup number `lookups + 1`, given `lookups` already made, before jitter.
    pub fn backoff(&self, lookups: u32) -> std::time::Duration {
        let base = f64::from(self.interval_seconds.max(1));
        let max = f64::from(self.max_interval_seconds.max(self.interval_seconds).max(1));
        let exponent = i32::try_from(lookups.saturating_sub(1))
            .unwrap_or(i32::MAX)
            .min(64);
        let seconds = (base * self.backoff_multiplier.powi(exponent)).clamp(0.0, max);
        // A multiplier out of range (refused in files, possible in code) never panics.
        std::time::Duration::try_from_secs_f64(seconds)
            .unwrap_or(std::time::Duration::from_secs_f64(max))
    }

    /// The same delay spread by `jitter`, using `unit` in [0, 1) as the random draw.
    pub fn backoff_with_jitter(&self, lookups: u32, unit: f64) -> std::time::Duration {
        let delay = self.backoff(lookups).as_secs_f64();
        let spread = 1.0 + self.jitter.clamp(0.0, 1.0) * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        std::time::Duration::try_from_secs_f64(delay * spread).unwrap_or(self.backoff(lookups))
    }
}

impl Policy {
    /// The policy used without a file: every action type is allowed, timeouts are
    /// reconciled before retry, and there is no provider lookup.
    pub fn builtin() -> Self {
        Self {
            defaults: Defaults::default(),
            default_action: Some(ActionPolicy::default()),
            actions: BTreeMap::new(),
            adapters: BTreeMap::new(),
        }
    }
    /// Records, in each action's `reconcile.adapter_kind`, the kind of the adapter it names,
    /// so that operations registered under it keep it (see [`ReconcilePolicy::adapter_kind`]).
    pub fn record_adapter_kinds(&mut self) {
        let adapters = &self.adapters;
        for action in self
            .actions
            .values_mut()
            .chain(self.default_action.as_mut())
        {
            action.reconcile.adapter_kind = action
                .reconcile
                .adapter
                .as_deref()
                .and_then(|name| adapters.get(name))
                .map(AdapterConfig::kind);
        }
    }

    /// The policy for an action type, or `None` when it is not configured.
    pub fn action(&self, action_type: &ActionType) -> Option<&ActionPolicy> {
        self.actions
            .get(action_type.as_str())
            .or(self.default_action.as_ref())
    }

    /// The longest lookup timeout of any adapter (zero without adapters).
    pub fn longest_lookup_timeout(&self) -> std::time::Duration {
        let seconds = self
            .adapters
            .values()
            .map(|adapter| match adapter {
                AdapterConfig::Http(http) => http.timeout_seconds,
                AdapterConfig::Grpc(grpc) => grpc.timeout_seconds,
                AdapterConfig::None => 0.0,
            })
            .fold(0.0_f64, f64::max);
        std::time::Duration::try_from_secs_f64(seconds.min(300.0)).unwrap_or_default()
    }

    /// The adapter configured for an action, if any.
    pub fn adapter_for(&self, action: &ActionPolicy) -> Option<(&str, &AdapterConfig)> {
        let name = action.reconcile.adapter.as_deref()?;
        self.adapters
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
    }

    /// Lease length for an action, in seconds.
    pub fn default_lease_seconds(&self, action: &ActionPolicy) -> u32 {
        action.lease_seconds.unwrap_or(self.defaults.lease_seconds)
    }

    /// The result rules for an action's results reported by `source`, `action` being the
    /// rules the operation was registered under; `None` (an action no longer configured) gets
    /// the deny-list and the default size limit only. Without `result.keep`, an http adapter's
    /// older `response.keep_fields` applies to what that adapter found. The deny-list and the
    /// adapters always come from today's file.
    pub fn result_rules<'a>(
        &'a self,
        action: Option<&'a ActionPolicy>,
        source: ResultSource<'_>,
    ) -> ResultRules<'a> {
        let deny = self.defaults.result_deny_fields.as_slice();
        let Some(action) = action else {
            return ResultRules {
                deny,
                ..ResultRules::default()
            };
        };
        let legacy_keep = || match source {
            ResultSource::Adapter(name) => match self.adapters.get(name) {
                Some(AdapterConfig::Http(http)) => Some(http.response.keep_fields.as_slice()),
                _ => None,
            },
            ResultSource::Caller => None,
        };
        ResultRules {
            keep: action.result.keep.as_deref().or_else(legacy_keep),
            deny,
            max_bytes: action
                .result
                .max_bytes
                .unwrap_or(result::DEFAULT_RESULT_MAX_BYTES),
        }
    }
}

/// Largest `result.max_bytes`, in bytes.
pub const MAX_RESULT_MAX_BYTES: usize = 1_048_576;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn builtin_policy_keeps_terminal_operations_for_the_default_retention() {
        let builtin = Policy::builtin();
        let action = builtin.default_action.as_ref().unwrap();
        assert_eq!(action.retention_days, DEFAULT_RETENTION_DAYS);
        // The same as an action written as `{}` in a policy file.
        let parsed = Policy::parse("default_action: {}\n", "policy.yaml").unwrap();
        assert_eq!(parsed.default_action.as_ref(), Some(action));
    }

    const EXAMPLE: &str = r#"
defaults:
  lease_seconds: 20
actions:
  create_payment:
    lease_seconds: 30
    retry:
      reuse_operation_key: true
      on_timeout: reconcile_before_retry
    reconcile:
      adapter: payments
      absence_grace_seconds: 60
  charge_deduplicated:
    retry:
      on_timeout: retry_with_same_key
adapters:
  payments:
    kind: http
    url: "http://127.0.0.1:8081/v1/payments/by-idempotency-key/{provider_key}"
    search_complete: true
    absent_match: { pointer: /error, values: [not_found], key_pointer: /idempotency_key }
    response:
      status_pointer: /status
      succeeded_values: [succeeded]
      key_pointer: /idempotency_key
      external_id_pointer: /id
      keep_fields: [/id, /status]
"#;

    #[test]
    fn the_example_policy_parses_with_its_defaults() {
        let policy = Policy::parse(EXAMPLE, "policy.yaml").unwrap();
        let pay = policy
            .action(&ActionType::parse("create_payment").unwrap())
            .unwrap();
        assert_eq!(policy.default_lease_seconds(pay), 30);
        assert!(!pay.provider_deduplicates());
        assert_eq!(pay.reconcile.first_check_after_seconds, 5);
        assert!(matches!(
            policy.adapter_for(pay),
            Some(("payments", AdapterConfig::Http(_)))
        ));
        let dedup = policy
            .action(&ActionType::parse("charge_deduplicated").unwrap())
            .unwrap();
        assert!(dedup.provider_deduplicates());
        assert_eq!(policy.default_lease_seconds(dedup), 20);
        assert!(
            policy
                .action(&ActionType::parse("send_fax").unwrap())
                .is_none()
        );
    }

    #[test]
    fn backoff_grows_to_the_maximum_and_jitter_spreads_it() {
        let reconcile = ReconcilePolicy {
            interval_seconds: 2,
            max_interval_seconds: 30,
            ..ReconcilePolicy::default()
        };
        let secs: Vec<u64> = (1..=6).map(|n| reconcile.backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 30, 30]);
        let low = reconcile.backoff_with_jitter(3, 0.0).as_secs_f64();
        let high = reconcile.backoff_with_jitter(3, 0.999).as_secs_f64();
        assert!((6.39..=6.41).contains(&low), "{low}");
        assert!((9.58..=9.61).contains(&high), "{high}");
    }

    #[test]
    fn a_typo_in_a_setting_is_refused_with_its_name() {
        let text = EXAMPLE.replace("lease_seconds: 30", "lease_secs: 30");
        let err = Policy::parse(&text, "policy.yaml").unwrap_err();
        assert!(err.to_string().contains("lease_secs"), "{err}");
        assert!(err.to_string().starts_with("policy.yaml"), "{err}");
    }

    #[test]
    fn an_unknown_adapter_reference_is_refused() {
        let text = EXAMPLE.replace("adapter: payments", "adapter: nowhere");
        let err = Policy::parse(&text, "policy.yaml").unwrap_err();
        assert!(
            err.to_string()
                .contains("actions.create_payment.reconcile.adapter"),
            "{err}"
        );
    }

    #[test]
    fn a_key_pattern_is_compiled_and_a_bad_one_is_refused_with_its_setting() {
        let text = EXAMPLE.replace(
            "    lease_seconds: 30\n",
            "    lease_seconds: 30\n    key_pattern: 'payment:order-[0-9]+:intent-[0-9]+'\n",
        );
        let policy = Policy::parse(&text, "policy.yaml").unwrap();
        let pay = policy
            .action(&ActionType::parse("create_payment").unwrap())
            .unwrap();
        assert_eq!(
            pay.key_pattern.as_ref().unwrap().as_str(),
            "payment:order-[0-9]+:intent-[0-9]+"
        );
        let bad = EXAMPLE.replace(
            "    lease_seconds: 30\n",
            "    lease_seconds: 30\n    key_pattern: '(unclosed'\n",
        );
        let err = Policy::parse(&bad, "policy.yaml").unwrap_err();
        assert!(err.to_string().contains("regular expression"), "{err}");
        assert!(err.to_string().contains("key_pattern"), "{err}");
    }

    #[test]
    fn result_keep_wins_and_the_adapters_keep_fields_apply_only_to_its_own_answers() {
        let policy = Policy::parse(EXAMPLE, "policy.yaml").unwrap();
        let pay = policy.action(&ActionType::parse("create_payment").unwrap());
        let legacy = ["/id", "/status"].map(String::from);
        assert_eq!(
            policy
                .result_rules(pay, ResultSource::Adapter("payments"))
                .keep,
            Some(&legacy[..])
        );
        assert_eq!(policy.result_rules(pay, ResultSource::Caller).keep, None);

        let text = EXAMPLE.replace(
            "    lease_seconds: 30\n",
            "    lease_seconds: 30\n    result: { keep: [/id, /card/last4], max_bytes: 2048 }\n",
        )
        .replace(
            "defaults:\n",
            "defaults:\n  result_deny_fields: [customer_email]\n",
        );
        let policy = Policy::parse(&text, "policy.yaml").unwrap();
        let pay = policy.action(&ActionType::parse("create_payment").unwrap());
        let kept = ["/id", "/card/last4"].map(String::from);
        for source in [ResultSource::Adapter("payments"), ResultSource::Caller] {
            let rules = policy.result_rules(pay, source);
            assert_eq!(rules.keep, Some(&kept[..]));
            assert_eq!(rules.max_bytes, 2048);
            assert!(rules.is_denied("customerEmail"));
            assert!(rules.is_denied("cvv"));
        }
        let unconfigured = policy.result_rules(None, ResultSource::Adapter("payments"));
        assert_eq!(unconfigured.keep, None);
        assert!(unconfigured.is_denied("customer_email"));
    }

    #[test]
    fn bad_result_settings_are_refused_with_their_name() {
        for (setting, message) in [
            (
                "result: { keep: [id] }",
                "actions.create_payment.result.keep",
            ),
            (
                "result: { keep: [/a/id, /b/id] }",
                "actions.create_payment.result.keep",
            ),
            (
                "result: { max_bytes: 0 }",
                "actions.create_payment.result.max_bytes",
            ),
            ("result: { keep_fields: [/id] }", "keep_fields"),
        ] {
            let text = EXAMPLE.replace(
                "    lease_seconds: 30\n",
                &format!("    lease_seconds: 30\n    {setting}\n"),
            );
            let err = Policy::parse(&text, "policy.yaml").unwrap_err();
            assert!(err.to_string().contains(message), "{setting}: {err}");
        }
        let text = EXAMPLE.replace("defaults:\n", "defaults:\n  result_deny_fields: ['_']\n");
        let err = Policy::parse(&text, "policy.yaml").unwrap_err();
        assert!(
            err.to_string().contains("defaults.result_deny_fields"),
            "{err}"
        );
    }

    /// The problem messages of `text` (empty when it parses).
    fn refusals(text: &str) -> String {
        Policy::parse(text, "policy.yaml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// Asserts that the example policy with `original` replaced by each case's text is
    /// refused with the case's message.
    fn assert_each_refused(original: &str, cases: &[(&str, &str)]) {
        for (replacement, expected) in cases {
            let error = refusals(&EXAMPLE.replace(original, replacement));
            assert!(error.contains(expected), "{replacement}: {error}");
        }
    }

    #[test]
    fn a_lookup_urls_host_is_the_one_written_however_it_is_spelled() {
        for url in [
            "http://[::1]:8081/v1/payments/{provider_key}",
            "https://api.example.com:443/v1/payments/{provider_key}",
            "https://api.example.com./v1/payments/{provider_key}",
            "https://API.Example.com/v1/payments?key={provider_key}&expand=none",
            "https://api.example.com/v1/{provider_key}/status",
        ] {
            assert_eq!(validate_url_template(url), Ok(()), "{url}");
        }
        for (url, expected) in [
            // A backslash ends the host for http(s) parsers; what follows it must not hide
            // another host or the key.
            (
                "http://api.example.com\\@evil.example/{provider_key}",
                "must not carry credentials",
            ),
            (
                "http://api.example.com\\{provider_key}",
                "must be in the path or the query",
            ),
            (
                "http://[::1]{provider_key}/x",
                "must be in the path or the query",
            ),
            (
                "http://api.example.com:{provider_key}/x",
                "must be in the path or the query",
            ),
            ("http:///{provider_key}", "must be in the path or the query"),
            (
                "https:////{provider_key}/x",
                "must be in the path or the query",
            ),
        ] {
            let error = validate_url_template(url).unwrap_err().to_string();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }

    #[test]
    fn a_lookup_url_naming_anything_but_the_provider_key_is_refused_with_the_reason() {
        let url = "http://127.0.0.1:8081/v1/payments/by-idempotency-key/{provider_key}";
        assert_each_refused(
            url,
            &[
                (
                    "http://127.0.0.1:8081/v1/payments/by-idempotency-key/{operation_key}",
                    "adapters.payments.url: {operation_key} names the journal's key, which is not \
                 the key the provider was called with",
                ),
                (
                    "http://127.0.0.1:8081/v1/payments/{external_id}",
                    "adapters.payments.url: {external_id} asks about the provider's id",
                ),
                (
                    "http://127.0.0.1:8081/v1/{namespace}/payments/{provider_key}",
                    "adapters.payments.url: {namespace} is part of the provider key already",
                ),
                (
                    "http://127.0.0.1:8081/v1/payments/{key}",
                    "adapters.payments.url: {key} is not a lookup variable",
                ),
                (
                    "http://127.0.0.1:8081/v1/payments/latest",
                    "adapters.payments.url: must contain {provider_key}",
                ),
                (
                    "http://{provider_key}.example.com/v1/payments",
                    "adapters.payments.url: {provider_key} must be in the path or the query",
                ),
                (
                    "http://user:pw@127.0.0.1:8081/v1/payments/{provider_key}",
                    "adapters.payments.url: must not carry credentials",
                ),
                (
                    "http://127.0.0.1:8081/v1/payments#{provider_key}",
                    "adapters.payments.url: must not have a fragment",
                ),
                (
                    "ftp://127.0.0.1/{provider_key}",
                    "adapters.payments.url: must start with http:// or https://",
                ),
            ],
        );
        let query = EXAMPLE.replace(
            url,
            "https://api.example.com/v1/payments?key={provider_key}",
        );
        assert_eq!(refusals(&query), "");
    }

    #[test]
    fn absence_rules_that_cannot_tell_a_wrong_route_from_a_missing_object_are_refused() {
        let rule =
            "absent_match: { pointer: /error, values: [not_found], key_pointer: /idempotency_key }";
        assert_each_refused(
            rule,
            &[
                (
                    "absent_match: { pointer: /error, values: [not_found] }",
                    "adapters.payments.absent_match: key_pointer is required with search_complete: true",
                ),
                (
                    "absent_statuses: [302]",
                    "adapters.payments.absent_statuses: 302 cannot mean \"not found\"",
                ),
                (
                    "absent_statuses: [200]",
                    "adapters.payments.absent_statuses: 200 cannot mean \"not found\"",
                ),
                (
                    "absent_statuses: [503]",
                    "adapters.payments.absent_statuses: 503 cannot mean \"not found\"",
                ),
                (
                    "absent_match: { pointer: /error, values: [], key_pointer: /idempotency_key }",
                    "adapters.payments.absent_match: values must name at least one value",
                ),
                (
                    "absent_match: { pointer: /error, values: [not_found], key_pointer: key }",
                    "adapters.payments.response: 'key' is not a JSON Pointer",
                ),
            ],
        );
        // Without a complete search, "not found" never releases: no key_pointer needed.
        let incomplete = EXAMPLE
            .replace(
                rule,
                "absent_match: { pointer: /error, values: [not_found] }",
            )
            .replace("search_complete: true", "search_complete: false");
        assert_eq!(refusals(&incomplete), "");
    }

    #[test]
    fn a_success_rule_that_no_status_can_meet_is_refused_and_one_that_any_answer_meets_warned() {
        let text = EXAMPLE.replace("      succeeded_values: [succeeded]\n", "");
        assert!(
            refusals(&text).contains(
                "adapters.payments.response: succeeded_values must name at least one status"
            ),
            "{}",
            refusals(&text)
        );
        let text = EXAMPLE.replace(
            "      status_pointer: /status\n      succeeded_values: [succeeded]\n",
            "",
        );
        let (_, warnings) = Policy::parse_with_warnings(&text, "policy.yaml").unwrap();
        let warnings = warnings.to_string();
        assert!(
            warnings.contains(
                "adapters.payments.response.status_pointer: is not set, so any 2xx JSON object \
                 the lookup gets counts as succeeded"
            ),
            "{warnings}"
        );
    }

    #[test]
    fn no_grace_window_is_warned_about_with_its_line() {
        let (_, warnings) = Policy::parse_with_warnings(EXAMPLE, "policy.yaml").unwrap();
        assert!(warnings.problems.is_empty(), "{warnings}");
        let text = EXAMPLE.replace("absence_grace_seconds: 60", "absence_grace_seconds: 0");
        let (_, warnings) = Policy::parse_with_warnings(&text, "policy.yaml").unwrap();
        assert_eq!(
            warnings.to_string(),
            "policy.yaml:12: actions.create_payment.reconcile.absence_grace_seconds: 0 lets the \
             first \"not found\" release the operation for another attempt, with no time for \
             the provider's search to catch up with its writes; a search that lags behind gives \
             a second effect"
        );
        // An adapter that cannot prove absence makes the grace window moot.
        let text = text.replace("search_complete: true", "search_complete: false");
        let (_, warnings) = Policy::parse_with_warnings(&text, "policy.yaml").unwrap();
        assert!(warnings.problems.is_empty(), "{warnings}");
    }

    #[test]
    fn the_adapters_kind_is_recorded_with_each_action_and_never_read_from_the_file() {
        let text = format!("{EXAMPLE}  email_none:\n    kind: none\n").replace(
            "  charge_deduplicated:\n",
            "  send_email:\n    reconcile: {adapter: email_none}\n  charge_deduplicated:\n",
        );
        let policy = Policy::parse(&text, "policy.yaml").unwrap();
        let kind = |action: &str| policy.actions[action].reconcile.adapter_kind;
        assert_eq!(kind("create_payment"), Some(AdapterKind::Http));
        assert_eq!(kind("send_email"), Some(AdapterKind::None));
        assert_eq!(kind("charge_deduplicated"), None);
        let recorded = serde_json::to_value(&policy.actions["send_email"]).unwrap();
        assert_eq!(recorded["reconcile"]["adapter_kind"], "none");

        let text = text.replace(
            "reconcile: {adapter: email_none}",
            "reconcile: {adapter: email_none, adapter_kind: http}",
        );
        assert!(
            refusals(&text)
                .contains("actions.send_email.reconcile.adapter_kind: is recorded by the journal"),
            "{}",
            refusals(&text)
        );
    }

    #[test]
    fn a_wrong_type_is_refused() {
        let text = EXAMPLE.replace("lease_seconds: 30", "lease_seconds: thirty");
        assert!(Policy::parse(&text, "policy.yaml").is_err());
    }
}
