//! Load drivers: closed loop (N clients, each sending its next call when the last one is
//! answered) and open loop (calls sent on a fixed schedule whatever the answers, latency
//! counted from the intended send time, so a stalled server cannot hide its queue: no
//! coordinated omission).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

/// Latencies are recorded in microseconds, from 1 µs to 60 s, with 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant bounds are valid")
}

/// Latencies of one run, by stage (`begin`, `complete`, `call`, `lifecycle`…).
///
/// A recorder keeps its own samples as a list and builds histograms only where recorders are
/// merged: the open loop gives each call its own recorder, and a histogram per call (about
/// 140 KiB for these bounds, one per stage) would make the benchmark itself the load.
#[derive(Default)]
pub struct Recorder {
    samples: Vec<(&'static str, u64)>,
    stages: BTreeMap<&'static str, Histogram<u64>>,
    recording: bool,
}

impl Recorder {
    /// Records `elapsed` under `stage` once the warm-up is over.
    pub fn record(&mut self, stage: &'static str, elapsed: Duration) {
        if !self.recording {
            return;
        }
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.samples.push((stage, micros.max(1)));
    }

    fn merge(&mut self, other: Recorder) {
        for (stage, micros) in other.samples {
            self.stages
                .entry(stage)
                .or_insert_with(histogram)
                .saturating_record(micros);
        }
        for (stage, hist) in other.stages {
            match self.stages.get_mut(stage) {
                Some(mine) => mine.add(&hist).expect("same bounds"),
                None => {
                    self.stages.insert(stage, hist);
                }
            }
        }
    }

    /// The histograms of every sample recorded here or merged in.
    fn into_stages(mut self) -> BTreeMap<&'static str, Histogram<u64>> {
        let own = Recorder {
            samples: std::mem::take(&mut self.samples),
            ..Recorder::default()
        };
        self.merge(own);
        self.stages
    }
}

/// The outcome of one load run.
pub struct RunResult {
    /// Scenario name.
    pub name: String,
    /// Calls (or lifecycles) answered as expected during the measured window.
    pub ok: u64,
    /// Unexpected answers or errors during the measured window.
    pub errors: u64,
    /// Calls the open loop could not send because too many were outstanding.
    pub dropped: u64,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Latencies by stage.
    pub latencies: BTreeMap<&'static str, Histogram<u64>>,
    /// The first unexpected answer, to show.
    pub first_error: Option<String>,
    /// Target rate of an open-loop run, per second.
    pub target_rate: Option<f64>,
    /// Calls made, warm-up included (what CPU time is divided by).
    pub all_calls: u64,
    /// Where the CPU went during the run (see [`crate::cpu`]), when measured.
    pub cpu: Option<Value>,
}

impl RunResult {
    /// Answered operations per second.
    pub fn throughput(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ok as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// A percentile of `stage` in milliseconds.
    pub fn percentile_ms(&self, stage: &str, q: f64) -> Option<f64> {
        self.latencies
            .get(stage)
            .filter(|h| !h.is_empty())
            .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
    }

    /// The run as JSON for the report.
    pub fn to_json(&self) -> Value {
        let stages: serde_json::Map<String, Value> = self
            .latencies
            .iter()
            .map(|(stage, h)| {
                let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                (
                    (*stage).to_owned(),
                    json!({
                        "count": h.len(),
                        "mean_ms": h.mean() / 1000.0,
                        "p50_ms": ms(0.50),
                        "p99_ms": ms(0.99),
                        "p99_9_ms": ms(0.999),
                        "max_ms": h.max() as f64 / 1000.0,
                    }),
                )
            })
            .collect();
        json!({
            "name": self.name,
            "ok": self.ok,
            "errors": self.errors,
            "dropped": self.dropped,
            "seconds": self.seconds,
            "throughput_per_second": self.throughput(),
            "target_rate_per_second": self.target_rate,
            "latency": stages,
            "first_error": self.first_error,
            "cpu": self.cpu,
        })
    }
}

/// One HTTP/2 connection per client, as each of pgbench's clients has its own connection.
pub async fn connect_all(address: &str, count: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = Endpoint::from_shared(format!("http://{address}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("cannot connect to the server at {address}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// What one call of a scenario returned: Ok, or an unexpected answer described.
pub type CallOutcome = Result<(), CallFailure>;

/// An unexpected answer to a scenario's call, described for the report's `first_error`.
/// Free text: it names the call (`Begin`, `Complete`) and either the client's error or the
/// decision expected and the one received; the run only counts failures and shows the first,
/// so nothing tells the kinds apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallFailure {
    /// The description, as the report shows it.
    pub message: String,
}

impl CallFailure {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// Runs `op` from `channels.len()` clients in a closed loop for `warmup + duration`;
/// only the last `duration` is measured. `op(channel, client, sequence, recorder)` does one
/// unit of work (a call, or a Begin and its Complete), records its stages in the recorder it
/// is lent and hands it back.
pub async fn closed_loop<F, Fut>(
    name: &str,
    channels: &[Channel],
    warmup: Duration,
    duration: Duration,
    op: F,
) -> RunResult
where
    F: Fn(Channel, usize, u64, Recorder) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = (CallOutcome, Recorder)> + Send,
{
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::new();
    for (client, channel) in channels.iter().cloned().enumerate() {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut recorder = Recorder::default();
            let (mut ok, mut errors) = (0u64, 0u64);
            let mut first_error = None;
            let mut sequence = 0u64;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                recorder.recording = now >= measure_from;
                let counted = recorder.recording;
                let (outcome, back) = op(channel.clone(), client, sequence, recorder).await;
                recorder = back;
                sequence += 1;
                // A call that ended after the window is not counted either way.
                if !counted || Instant::now() > end {
                    continue;
                }
                match outcome {
                    Ok(()) => ok += 1,
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert(error.message);
                    }
                }
            }
            (recorder, ok, errors, first_error, sequence)
        }));
    }
    let mut all = Recorder::default();
    let (mut ok, mut errors, mut first_error, mut all_calls) = (0, 0, None, 0);
    for task in tasks {
        match task.await {
            Ok((recorder, o, e, f, calls)) => {
                all_calls += calls;
                all.merge(recorder);
                ok += o;
                errors += e;
                if first_error.is_none() {
                    first_error = f;
                }
            }
            Err(join) => {
                errors += 1;
                first_error.get_or_insert(format!("client task failed: {join}"));
            }
        }
    }
    RunResult {
        name: name.to_owned(),
        ok,
        errors,
        dropped: 0,
        seconds: duration.as_secs_f64(),
        latencies: all.into_stages(),
        first_error,
        target_rate: None,
        all_calls,
        cpu: None,
    }
}

/// Sends `op` at `rate` per second for `warmup + duration`, spread over `channels`
/// round-robin, each call in its own task; `op` records latencies from the intended send
/// time it is given. At most `max_outstanding` calls are in flight; a call that finds none
/// free is counted as dropped (the server could not keep up), never delayed.
pub async fn open_loop<F, Fut>(
    name: &str,
    channels: &[Channel],
    rate: f64,
    warmup: Duration,
    duration: Duration,
    max_outstanding: usize,
    op: F,
) -> RunResult
where
    F: Fn(Channel, u64, Instant, Recorder) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = (CallOutcome, Recorder)> + Send + 'static,
{
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let permits = Arc::new(Semaphore::new(max_outstanding));
    let dropped = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut sequence = 0u64;
    loop {
        let intended = start + interval.mul_f64(sequence as f64);
        if intended >= end {
            break;
        }
        tokio::time::sleep_until(intended.into()).await;
        let counted = intended >= measure_from;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if counted {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
            sequence += 1;
            continue;
        };
        let channel = channels[(sequence as usize) % channels.len()].clone();
        let op = op.clone();
        let seq = sequence;
        tasks.push(tokio::spawn(async move {
            let recorder = Recorder {
                recording: counted,
                ..Recorder::default()
            };
            let (outcome, recorder) = op(channel, seq, intended, recorder).await;
            drop(permit);
            (counted, outcome, recorder)
        }));
        sequence += 1;
    }
    let mut all = Recorder::default();
    let (mut ok, mut errors, mut first_error) = (0, 0, None);
    for task in tasks {
        match task.await {
            Ok((counted, outcome, recorder)) => {
                if !counted {
                    continue;
                }
                all.merge(recorder);
                match outcome {
                    Ok(()) => ok += 1,
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert(error.message);
                    }
                }
            }
            Err(join) => {
                errors += 1;
                first_error.get_or_insert(format!("call task failed: {join}"));
            }
        }
    }
    RunResult {
        name: name.to_owned(),
        ok,
        errors,
        dropped: dropped.load(Ordering::Relaxed),
        seconds: duration.as_secs_f64(),
        latencies: all.into_stages(),
        first_error,
        target_rate: Some(rate),
        all_calls: sequence,
        cpu: None,
    }
}
