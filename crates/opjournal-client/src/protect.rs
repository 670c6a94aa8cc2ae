//! [`Protected`]: an async function that calls a provider, made into a protected call.
//!
//! The idempotency key is always a function of the arguments written in the orchestrator's
//! code (an order id, a run id, an intent id from context), or a key the server derives
//! from such a reference: never text a model produced, because a model may word the same
//! intent two ways, and two keys are two payments.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::client::JournalClient;
use crate::error::ClientError;
use crate::execute::{ExecuteOptions, ProviderCall};
use crate::executed::Executed;
use crate::intent::Intent;
use crate::provider::{ProviderError, ProviderOutcome, ProviderSuccess};

type KeyFn<A> = Arc<dyn Fn(&A) -> String + Send + Sync>;
type PayloadFn<A> = Arc<dyn Fn(&A) -> Result<Value, ClientError> + Send + Sync>;
type ClassifyFn = Arc<dyn Fn(&ProviderError) -> ProviderOutcome + Send + Sync>;
type ReferenceFn<A> = (String, Arc<dyn Fn(&A) -> String + Send + Sync>);

/// An async provider function `call(args, provider_call) -> Result<ProviderSuccess,
/// ProviderError>` wrapped so that every [`Protected::call`] goes through
/// [`JournalClient::execute_with`]: the intent is journaled first, the function runs only
/// on `EXECUTE` (at most once per attempt, with the lease renewed), and a replay returns
/// the stored outcome without running it.
///
/// - the **key** comes from `key(&args)`: the operation key itself, or with
///   [`Protected::derive_key_on_server`] an intent reference the server turns into an
///   opaque key (`DeriveOperationKey`);
/// - the **payload** the key is bound to is `payload(&args)` (a declared subset of the
///   arguments) or, with [`Protected::with_args_as_payload`], all of them;
/// - **errors** of the function are classified by a hook, by default
///   [`ProviderError::outcome`]: only [`ProviderError::Rejected`] is a rejection, anything
///   else is an uncertain outcome left to reconciliation.
///
/// ```no_run
/// # async fn example(client: opjournal_client::JournalClient) -> Result<(), opjournal_client::ClientError> {
/// use opjournal_client::{ProviderCall, ProviderError, ProviderSuccess, Protected};
/// use serde_json::json;
///
/// struct Charge { order_id: String, amount_minor: u64 }
///
/// async fn charge(args: Charge, call: ProviderCall) -> Result<ProviderSuccess, ProviderError> {
///     // POST to the provider with `Idempotency-Key: {call.provider_key}`; `?` on any error
///     // makes it an uncertain outcome; a decline is `Err(ProviderError::rejected(..))`.
///     Ok(ProviderSuccess::new("pay_123"))
/// }
///
/// let pay = Protected::new(
///     client,
///     "create_payment",
///     |args: &Charge| format!("payment:order-{}", args.order_id),
///     |args: &Charge| json!({"order_id": args.order_id, "amount_minor": args.amount_minor}),
///     charge,
/// );
/// let executed = pay.call(Charge { order_id: "817".into(), amount_minor: 1000 }).await?;
/// println!("{}", executed.to_json());
/// # Ok(())
/// # }
/// ```
pub struct Protected<A, F> {
    client: JournalClient,
    action_type: String,
    namespace: String,
    key: KeyFn<A>,
    derive_key: bool,
    payload: PayloadFn<A>,
    references: Vec<ReferenceFn<A>>,
    classify: ClassifyFn,
    options: ExecuteOptions,
    lease: Option<Duration>,
    call: F,
}

impl<A, F, Fut> Protected<A, F>
where
    F: Fn(A, ProviderCall) -> Fut,
    Fut: Future<Output = Result<ProviderSuccess, ProviderError>>,
{
    /// Protects `call` for `action_type` (as named in the server's policy file), with the
    /// key `key(&args)` bound to the payload `payload(&args)` (a JSON object).
    pub fn new(
        client: JournalClient,
        action_type: impl Into<String>,
        key: impl Fn(&A) -> String + Send + Sync + 'static,
        payload: impl Fn(&A) -> Value + Send + Sync + 'static,
        call: F,
    ) -> Self {
        Self::with_payload_fn(
            client,
            action_type,
            key,
            Arc::new(move |args| Ok(payload(args))),
            call,
        )
    }

    /// Protects `call` with the whole arguments, serialized, as the payload.
    ///
    /// [`Protected::call`] fails with `INVALID_ARGUMENT`/`INVALID_PAYLOAD` (nothing sent)
    /// when they cannot be serialized.
    pub fn with_args_as_payload(
        client: JournalClient,
        action_type: impl Into<String>,
        key: impl Fn(&A) -> String + Send + Sync + 'static,
        call: F,
    ) -> Self
    where
        A: serde::Serialize,
    {
        let payload = |args: &A| {
            serde_json::to_value(args).map_err(|_| ClientError::unserializable_payload())
        };
        Self::with_payload_fn(client, action_type, key, Arc::new(payload), call)
    }

    fn with_payload_fn(
        client: JournalClient,
        action_type: impl Into<String>,
        key: impl Fn(&A) -> String + Send + Sync + 'static,
        payload: PayloadFn<A>,
        call: F,
    ) -> Self {
        Self {
            client,
            action_type: action_type.into(),
            namespace: String::new(),
            key: Arc::new(key),
            derive_key: false,
            payload,
            references: Vec::new(),
            classify: Arc::new(ProviderError::outcome),
            options: ExecuteOptions::default(),
            lease: None,
            call,
        }
    }

    /// Sends `key(&args)` to `DeriveOperationKey` as the intent reference and uses the
    /// derived opaque key: for references that may hold personal data (the server must
    /// have a key derivation secret).
    #[must_use]
    pub fn derive_key_on_server(mut self) -> Self {
        self.derive_key = true;
        self
    }

    /// Operations in `namespace` instead of `default`.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Keeps the business link `name` = `value(&args)` (e.g. `order_id`) with the record;
    /// references are not hashed.
    #[must_use]
    pub fn with_reference(
        mut self,
        name: impl Into<String>,
        value: impl Fn(&A) -> String + Send + Sync + 'static,
    ) -> Self {
        self.references.push((name.into(), Arc::new(value)));
        self
    }

    /// Asks for leases of `length` (whole seconds) instead of the action's default.
    #[must_use]
    pub fn with_lease(mut self, length: Duration) -> Self {
        self.lease = Some(length);
        self
    }

    /// Classifies the function's errors with `hook` instead of [`ProviderError::outcome`],
    /// e.g. to name the HTTP statuses the provider documents as definitive rejections.
    /// Returning [`ProviderOutcome::Succeeded`] records a success.
    #[must_use]
    pub fn classify(
        mut self,
        hook: impl Fn(&ProviderError) -> ProviderOutcome + Send + Sync + 'static,
    ) -> Self {
        self.classify = Arc::new(hook);
        self
    }

    /// Waits as `options` say for another holder's lease or an unknown outcome.
    #[must_use]
    pub fn with_options(mut self, options: ExecuteOptions) -> Self {
        self.options = options;
        self
    }

    /// The operation key for `args` (derived by the server when so configured).
    ///
    /// Errors: those of [`JournalClient::derive_key`].
    pub async fn key(&self, args: &A) -> Result<String, ClientError> {
        let key = (self.key)(args);
        if self.derive_key {
            self.client
                .derive_key(&self.namespace, &self.action_type, &key)
                .await
        } else {
            Ok(key)
        }
    }

    /// Runs the protected call: the function is called only if the journal says
    /// `EXECUTE`; otherwise the stored outcome or the decision comes back.
    ///
    /// Errors: those of [`JournalClient::execute_with`] (a conflict is
    /// `ALREADY_EXISTS`/`IDEMPOTENCY_KEY_REUSED`, a taken-over lease
    /// `ABORTED`/`LEASE_LOST`), of [`Self::key`], and `INVALID_PAYLOAD` for arguments that
    /// do not serialize.
    ///
    /// Cancellation: dropping the returned future (a `tokio::time::timeout`, a `select!`)
    /// after Begin answered `EXECUTE` leaves the operation `in_progress` until its lease
    /// ends, then `unknown` — whether or not the function had started. Put deadlines inside
    /// the function (on the provider call), where they become a classified outcome.
    pub async fn call(&self, args: A) -> Result<Executed, ClientError> {
        let key = self.key(&args).await?;
        let payload = (self.payload)(&args)?;
        let mut intent = Intent::new(key, self.action_type.clone(), payload)
            .in_namespace(self.namespace.clone());
        intent.lease = self.lease;
        for (name, value) in &self.references {
            intent = intent.with_reference(name.clone(), value(&args));
        }
        let classify = Arc::clone(&self.classify);
        self.client
            .execute_with(intent, &self.options, |provider_call| {
                let running = (self.call)(args, provider_call);
                async move {
                    match running.await {
                        Ok(success) => success.into(),
                        Err(error) => classify(&error),
                    }
                }
            })
            .await
    }
}

impl<A, F: Clone> Clone for Protected<A, F> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            action_type: self.action_type.clone(),
            namespace: self.namespace.clone(),
            key: Arc::clone(&self.key),
            derive_key: self.derive_key,
            payload: Arc::clone(&self.payload),
            references: self.references.clone(),
            classify: Arc::clone(&self.classify),
            options: self.options.clone(),
            lease: self.lease,
            call: self.call.clone(),
        }
    }
}

impl<A, F> fmt::Debug for Protected<A, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Protected")
            .field("action_type", &self.action_type)
            .field("namespace", &self.namespace)
            .field("derive_key", &self.derive_key)
            .field("options", &self.options)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}
