//! Per-pod device scoring weights (`hami.io/device-scoring-weights`,
//! HAMi #2469): how much a GPU's slice, core and memory fractions weigh
//! when the GPUs of a node are ordered for a pod.

use std::fmt;

use super::shown::shown;
use tessera_api::names::annotations::DEVICE_SCORING_WEIGHTS;

/// The weights of a GPU's three fractions in its device score; HAMi's
/// defaults are 1 each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoringWeights {
    /// Weight of the fraction of the device's slices held.
    pub slot: u64,
    /// Weight of the fraction of its cores held.
    pub core: u64,
    /// Weight of the fraction of its memory held.
    pub memory: u64,
}

impl Default for ScoringWeights {
    fn default() -> Self {
        Self {
            slot: 1,
            core: 1,
            memory: 1,
        }
    }
}

impl fmt::Display for ScoringWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot={},core={},memory={}",
            self.slot, self.core, self.memory
        )
    }
}

/// Reads `slot=A,core=B,memory=C` (any order, blanks around entries, keys
/// and values ignored) as HAMi's `ParseDeviceScoringWeights` does, with its
/// messages and in its order of checks: exactly three entries, each
/// `key=value`, no key twice, integer, not negative, a known key; and at
/// least one weight above 0. An empty value is an error, not the defaults.
pub fn parse(value: &str) -> Result<ScoringWeights, String> {
    let fail = |detail: String| {
        format!(
            "invalid {DEVICE_SCORING_WEIGHTS} annotation {}: {detail}",
            shown(value)
        )
    };
    let entries: Vec<&str> = value.split(',').collect();
    if entries.len() != 3 {
        return Err(fail("expected slot, core, and memory weights".into()));
    }
    let mut weights = ScoringWeights {
        slot: 0,
        core: 0,
        memory: 0,
    };
    let mut seen: Vec<&str> = Vec::with_capacity(3);
    for entry in entries {
        let Some((key, number)) = entry.trim().split_once('=') else {
            return Err(fail("expected key=value entries".into()));
        };
        let (key, number) = (key.trim(), number.trim());
        if seen.contains(&key) {
            return Err(fail(format!("duplicate {} weight", shown(key))));
        }
        seen.push(key);
        let number: i64 = number
            .parse()
            .map_err(|_| fail(format!("{} weight must be an integer", shown(key))))?;
        let Ok(number) = u64::try_from(number) else {
            return Err(fail(format!("{} weight must not be negative", shown(key))));
        };
        match key {
            "slot" => weights.slot = number,
            "core" => weights.core = number,
            "memory" => weights.memory = number,
            _ => return Err(fail(format!("unknown weight {}", shown(key)))),
        }
    }
    if weights.slot == 0 && weights.core == 0 && weights.memory == 0 {
        return Err(fail("at least one weight must be positive".into()));
    }
    Ok(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(slot: u64, core: u64, memory: u64) -> ScoringWeights {
        ScoringWeights { slot, core, memory }
    }

    /// HAMi's `TestParseDeviceScoringWeights`, case by case.
    #[test]
    fn parses_as_hami_does() {
        assert_eq!(parse("slot=1,core=2,memory=3"), Ok(weights(1, 2, 3)));
        assert_eq!(
            parse(" memory = 3, slot = 1, core = 0 "),
            Ok(weights(1, 0, 3))
        );
        assert_eq!(parse("slot=+3,core=03,memory=0"), Ok(weights(3, 3, 0)));
        let cases = [
            ("", "expected slot, core, and memory weights"),
            ("slot=1,memory=3", "expected slot, core, and memory weights"),
            (
                "slot=1,core=1,memory=3,",
                "expected slot, core, and memory weights",
            ),
            ("slot=1,core,memory=3", "expected key=value entries"),
            (
                "slot=1,core=high,memory=3",
                "\"core\" weight must be an integer",
            ),
            (
                "slot=1,core=1.5,memory=3",
                "\"core\" weight must be an integer",
            ),
            (
                "slot=1,core=-1,memory=3",
                "\"core\" weight must not be negative",
            ),
            (
                "slot=1,bandwidth=2,memory=3",
                "unknown weight \"bandwidth\"",
            ),
            (
                "slot=1,bandwidth=x,memory=3",
                "\"bandwidth\" weight must be an integer",
            ),
            ("slot=1,slot=2,memory=3", "duplicate \"slot\" weight"),
            (
                "slot=0,core=0,memory=0",
                "at least one weight must be positive",
            ),
            ("Slot=1,core=1,memory=1", "unknown weight \"Slot\""),
        ];
        for (value, detail) in cases {
            let error = parse(value).expect_err(value);
            assert_eq!(
                error,
                format!("invalid hami.io/device-scoring-weights annotation {value:?}: {detail}")
            );
        }
    }

    #[test]
    fn defaults_are_one_each_and_print_as_written() {
        assert_eq!(ScoringWeights::default(), weights(1, 1, 1));
        assert_eq!(weights(1, 1, 3).to_string(), "slot=1,core=1,memory=3");
        assert_eq!(parse(&weights(4, 0, 2).to_string()), Ok(weights(4, 0, 2)));
    }
}
