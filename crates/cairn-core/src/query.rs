//! Queries (Q1–Q4) and consistency observations (C1).
//!
//! A [`Query`] is an OR of [`Criterion`]s; a criterion is an AND of [`Tag`]s. Observations
//! are normalised before they are checked or stored, so that the same context spelled two
//! ways is one context.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_CRITERIA, MAX_OBSERVATIONS, MAX_TAGS};
use crate::{Error, Position};

/// Equality of a top-level data key with a scalar's text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tag {
    /// Literal top-level key (Q2).
    pub key: String,
    /// Scalar text (Q3).
    pub value: String,
}

impl Tag {
    /// Builds a tag.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Tag {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// AND of tags. After [`Criterion::normalize`], tags are sorted by key with unique keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Criterion {
    /// The tags, all of which must match.
    pub tags: Vec<Tag>,
}

/// OR of criteria.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Query {
    /// The criteria, any of which may match. Empty matches every event (Q1).
    pub criteria: Vec<Criterion>,
}

/// "The context `query` was at `position` when I decided."
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Observation {
    /// The context query, normalised.
    pub query: Query,
    /// Greatest matching position seen, or `(-1,-1)`.
    pub position: Position,
}

/// Checks a tag's key and value (Q4).
fn validate_tag(tag: &Tag, at: &dyn Fn() -> String) -> Result<(), Error> {
    if tag.key.is_empty() {
        return Err(Error::invalid(format!("{}: tag key is empty", at())));
    }
    if tag.key.contains('\0') || tag.value.contains('\0') {
        return Err(Error::invalid(format!(
            "{}: tag key or value contains a NUL character",
            at()
        )));
    }
    Ok(())
}

impl Criterion {
    /// Builds a criterion from `(key, value)` pairs.
    pub fn of<K: Into<String>, V: Into<String>>(tags: impl IntoIterator<Item = (K, V)>) -> Self {
        Criterion {
            tags: tags.into_iter().map(|(k, v)| Tag::new(k, v)).collect(),
        }
    }

    /// Validates (Q4, non-empty) and normalises: tags sorted by key, a key repeated with the
    /// same value merged, a key repeated with two values rejected (C1).
    pub fn normalize(mut self, at: &dyn Fn() -> String) -> Result<Criterion, Error> {
        if self.tags.is_empty() {
            return Err(Error::invalid(format!("{}: criterion has no tags", at())));
        }
        for tag in &self.tags {
            validate_tag(tag, at)?;
        }
        self.tags.sort();
        self.tags.dedup();
        if let Some(w) = self.tags.windows(2).find(|w| w[0].key == w[1].key) {
            return Err(Error::invalid(format!(
                "{}: key {:?} is repeated with two different values",
                at(),
                w[0].key
            )));
        }
        Ok(self)
    }

    /// True when every tag is satisfied by `scalars` (key → scalar text).
    pub fn matches(&self, scalars: &BTreeMap<String, String>) -> bool {
        self.tags
            .iter()
            .all(|t| scalars.get(&t.key).is_some_and(|v| *v == t.value))
    }
}

impl Query {
    /// Builds a query from criteria.
    pub fn of(criteria: impl IntoIterator<Item = Criterion>) -> Self {
        Query {
            criteria: criteria.into_iter().collect(),
        }
    }

    /// Number of tags across all criteria.
    pub fn tag_count(&self) -> usize {
        self.criteria.iter().map(|c| c.tags.len()).sum()
    }

    /// Validates and normalises a read filter (GetEvents, subscriptions): zero criteria is
    /// allowed and matches everything; each criterion must be valid.
    pub fn normalize_filter(self) -> Result<Query, Error> {
        check_sizes(self.criteria.len(), self.tag_count(), "query")?;
        self.normalize_criteria()
    }

    /// Validates and normalises a context query: at least one criterion.
    fn normalize_context(self, at: &dyn Fn() -> String) -> Result<Query, Error> {
        if self.criteria.is_empty() {
            return Err(Error::invalid(format!("{}: query has no criteria", at())));
        }
        self.normalize_criteria_at(at)
    }

    fn normalize_criteria(self) -> Result<Query, Error> {
        self.normalize_criteria_at(&|| "query".to_string())
    }

    fn normalize_criteria_at(self, at: &dyn Fn() -> String) -> Result<Query, Error> {
        let mut criteria = self
            .criteria
            .into_iter()
            .enumerate()
            .map(|(i, c)| c.normalize(&|| format!("{}, criterion {i}", at())))
            .collect::<Result<Vec<_>, _>>()?;
        criteria.sort();
        criteria.dedup();
        Ok(Query { criteria })
    }

    /// True when the query matches an event with these scalars (Q1).
    pub fn matches(&self, scalars: &BTreeMap<String, String>) -> bool {
        self.criteria.is_empty() || self.criteria.iter().any(|c| c.matches(scalars))
    }
}

fn check_sizes(criteria: usize, tags: usize, what: &str) -> Result<(), Error> {
    if criteria > MAX_CRITERIA {
        return Err(Error::invalid(format!(
            "{what} has {criteria} criteria; the limit is {MAX_CRITERIA}"
        )));
    }
    if tags > MAX_TAGS {
        return Err(Error::invalid(format!(
            "{what} has {tags} tags; the limit is {MAX_TAGS}"
        )));
    }
    Ok(())
}

/// Validates and normalises the observations of one write (C1).
///
/// Returns them sorted by query, with identical (query, position) pairs merged. The same
/// normalised query observed at two different positions is a contradiction and rejected.
pub fn normalize_observations(observations: Vec<Observation>) -> Result<Vec<Observation>, Error> {
    if observations.len() > MAX_OBSERVATIONS {
        return Err(Error::invalid(format!(
            "write has {} consistency observations; the limit is {MAX_OBSERVATIONS}",
            observations.len()
        )));
    }
    let criteria: usize = observations.iter().map(|o| o.query.criteria.len()).sum();
    let tags: usize = observations.iter().map(|o| o.query.tag_count()).sum();
    check_sizes(criteria, tags, "consistency")?;

    let mut merged: BTreeMap<Query, Position> = BTreeMap::new();
    for (i, obs) in observations.into_iter().enumerate() {
        let at = || format!("consistency observation {i}");
        obs.position
            .validate_observed()
            .map_err(|e| Error::invalid(format!("{}: {e}", at())))?;
        let query = obs.query.normalize_context(&at)?;
        match merged.get(&query) {
            Some(p) if *p != obs.position => {
                return Err(Error::invalid(format!(
                    "{}: the same query is observed at two positions, {} and {}",
                    at(),
                    p,
                    obs.position
                )));
            }
            Some(_) => {}
            None => {
                merged.insert(query, obs.position);
            }
        }
    }
    Ok(merged
        .into_iter()
        .map(|(query, position)| Observation { query, position })
        .collect())
}

/// Validates and normalises the criteria of GetLatestByCriteria (G2), keeping request order
/// (results echo it) but normalising each criterion.
pub fn normalize_latest_criteria(criteria: Vec<Criterion>) -> Result<Vec<Criterion>, Error> {
    if criteria.is_empty() {
        return Err(Error::invalid("criteria is empty"));
    }
    let tags = criteria.iter().map(|c| c.tags.len()).sum();
    check_sizes(criteria.len(), tags, "request")?;
    criteria
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.normalize(&|| format!("criterion {i}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(criteria: Vec<Criterion>, p: Position) -> Observation {
        Observation {
            query: Query::of(criteria),
            position: p,
        }
    }

    #[test]
    fn criterion_normalisation_sorts_merges_and_rejects_contradictions() {
        let at = || "here".to_string();
        let c = Criterion::of([("b", "1"), ("a", "2"), ("b", "1")])
            .normalize(&at)
            .expect("valid");
        assert_eq!(c, Criterion::of([("a", "2"), ("b", "1")]));
        let err = Criterion::of([("a", "1"), ("a", "2")])
            .normalize(&at)
            .expect_err("contradiction");
        assert!(err.to_string().contains("repeated"), "{err}");
        assert!(Criterion::default().normalize(&at).is_err());
        assert!(Criterion::of([("", "1")]).normalize(&at).is_err());
        assert!(Criterion::of([("a\0", "1")]).normalize(&at).is_err());
        assert!(Criterion::of([("a", "x\0")]).normalize(&at).is_err());
        assert!(Criterion::of([("a", "")]).normalize(&at).is_ok());
    }

    #[test]
    fn observations_merge_and_conflict() {
        let q1 = vec![Criterion::of([("x", "1")]), Criterion::of([("y", "2")])];
        let q1_reordered = vec![
            Criterion::of([("y", "2")]),
            Criterion::of([("x", "1")]),
            Criterion::of([("x", "1")]),
        ];
        let p = Position::new(3, 2);
        let merged = normalize_observations(vec![obs(q1.clone(), p), obs(q1_reordered.clone(), p)])
            .expect("same query, same position merges");
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].query.criteria.len(), 2);

        let err = normalize_observations(vec![obs(q1, p), obs(q1_reordered, Position::NONE)])
            .expect_err("different positions");
        assert!(err.to_string().contains("two positions"), "{err}");
    }

    #[test]
    fn observation_validation() {
        assert!(normalize_observations(vec![obs(vec![], Position::NONE)]).is_err());
        assert!(
            normalize_observations(vec![obs(
                vec![Criterion::of([("a", "1")])],
                Position::new(-1, 3)
            )])
            .is_err()
        );
        let too_many = (0..=MAX_OBSERVATIONS)
            .map(|i| obs(vec![Criterion::of([("a", i.to_string())])], Position::NONE))
            .collect();
        assert!(normalize_observations(too_many).is_err());
        let many_criteria = (0..=MAX_CRITERIA)
            .map(|i| Criterion::of([("a", i.to_string())]))
            .collect();
        assert!(normalize_observations(vec![obs(many_criteria, Position::NONE)]).is_err());
    }

    #[test]
    fn matching() {
        let scalars: BTreeMap<String, String> = [("a", "1"), ("b", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(Query::default().matches(&scalars));
        assert!(Query::of([Criterion::of([("a", "1"), ("b", "2")])]).matches(&scalars));
        assert!(!Query::of([Criterion::of([("a", "1"), ("b", "3")])]).matches(&scalars));
        assert!(
            Query::of([Criterion::of([("a", "9")]), Criterion::of([("b", "2")])]).matches(&scalars)
        );
    }
}
