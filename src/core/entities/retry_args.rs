//! The queue arguments of delayed retries: RabbitMQ 4.3's `x-delayed-retry-type`
//! (`all` | `returned` | `failed` | `disabled`), `x-delayed-retry-min` and
//! `x-delayed-retry-max` (ms, linear backoff), and FerryMQ's `x-retry-backoff` (a list of
//! steps such as `10s,30s,1m`, which takes precedence and on its own means type `all`).

use crate::core::queue::{parse_steps, Backoff, RetryOn, RetryPolicy, MAX_DELAY_MS};
use crate::core::value::Value;

use super::arguments::ArgumentError;

/// Names of the arguments, for equivalence checks on re-declare.
pub(crate) const RETRY_ARGUMENTS: [&str; 4] =
    ["x-delayed-retry-type", "x-delayed-retry-min", "x-delayed-retry-max", "x-retry-backoff"];

/// The retry policy the arguments ask for (`None`: no delayed retries), or the
/// PRECONDITION_FAILED text for invalid ones.
pub(crate) fn retry_policy(
    vhost: &str,
    name: &str,
    args: &[(String, Value)],
) -> Result<Option<RetryPolicy>, ArgumentError> {
    let find = |key: &str| args.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let invalid = |key: &str, why: String| ArgumentError::invalid(vhost, name, key, why);
    // Outer `None`: not given; `Some(None)`: `disabled`.
    let on = match find("x-delayed-retry-type") {
        None => None,
        Some(v) => match v.as_str().map(RetryOn::parse) {
            Some(Ok(on)) => Some(on),
            _ => {
                return Err(invalid("x-delayed-retry-type", format!("{{unknown_delayed_retry_type,{}}}", v.to_text())))
            }
        },
    };
    let millis = |key: &str, least: u64| -> Result<Option<u64>, ArgumentError> {
        match find(key) {
            None => Ok(None),
            Some(v) => match v.as_i64().and_then(|i| u64::try_from(i).ok()) {
                Some(ms) if (least..=MAX_DELAY_MS).contains(&ms) => Ok(Some(ms)),
                _ => Err(invalid(key, format!("{{value_out_of_range,{}}}", v.to_text()))),
            },
        }
    };
    let min = millis("x-delayed-retry-min", 1)?;
    let max = millis("x-delayed-retry-max", 1)?;
    if let (Some(min), Some(max)) = (min, max) {
        if max < min {
            return Err(invalid("x-delayed-retry-max", format!("{{less_than_min,{max},{min}}}")));
        }
    }
    let steps = match find("x-retry-backoff") {
        None => None,
        Some(Value::Str(list)) => Some(parse_steps(list).map_err(|why| invalid("x-retry-backoff", why))?),
        Some(other) => return Err(invalid("x-retry-backoff", format!("{{not_a_string,{}}}", other.to_text()))),
    };
    let backoff = match (steps, min) {
        (Some(steps), _) => Backoff::Steps(steps),
        (None, Some(min_ms)) => Backoff::Linear { min_ms, max_ms: max.unwrap_or(MAX_DELAY_MS) },
        (None, None) => {
            if matches!(on, Some(Some(_))) || max.is_some() {
                return Err(invalid("x-delayed-retry-min", "{missing,needed for delayed retries}".into()));
            }
            return Ok(None);
        }
    };
    Ok(match on {
        Some(None) => None,
        Some(Some(on)) => Some(RetryPolicy { on, backoff }),
        None => Some(RetryPolicy { on: RetryOn::All, backoff }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    fn policy(pairs: &[(&str, Value)]) -> Result<Option<RetryPolicy>, ArgumentError> {
        retry_policy("/", "q", &args(pairs))
    }

    #[test]
    fn linear_and_steps() {
        let p = policy(&[
            ("x-delayed-retry-type", Value::Str("failed".into())),
            ("x-delayed-retry-min", Value::Int(100)),
            ("x-delayed-retry-max", Value::Int32(500)),
        ]);
        assert_eq!(
            p,
            Ok(Some(RetryPolicy { on: RetryOn::Failed, backoff: Backoff::Linear { min_ms: 100, max_ms: 500 } }))
        );
        let p = policy(&[("x-retry-backoff", Value::Str("1s,2m".into())), ("x-delayed-retry-min", Value::Int(100))]);
        assert_eq!(
            p,
            Ok(Some(RetryPolicy { on: RetryOn::All, backoff: Backoff::Steps(vec![1000, 120_000]) })),
            "steps win; alone they mean all"
        );
        assert_eq!(policy(&[]), Ok(None));
        assert_eq!(
            policy(&[("x-delayed-retry-type", Value::Str("disabled".into())), ("x-delayed-retry-min", Value::Int(5))]),
            Ok(None)
        );
    }

    #[test]
    fn invalid_arguments() {
        for bad in [
            vec![("x-delayed-retry-type", Value::Str("sometimes".into())), ("x-delayed-retry-min", Value::Int(5))],
            vec![("x-delayed-retry-type", Value::Str("all".into()))],
            vec![("x-delayed-retry-min", Value::Int(0))],
            vec![("x-delayed-retry-min", Value::Int(-5))],
            vec![("x-delayed-retry-min", Value::Int(500)), ("x-delayed-retry-max", Value::Int(100))],
            vec![("x-delayed-retry-min", Value::Str("soon".into()))],
            vec![("x-retry-backoff", Value::Str("10x".into()))],
            vec![("x-retry-backoff", Value::Int(10))],
        ] {
            let e = policy(&bad).expect_err(&format!("{bad:?}"));
            assert!(e.0.starts_with("PRECONDITION_FAILED - invalid arg 'x-"), "{e}");
        }
    }
}
