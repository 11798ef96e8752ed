//! A bridge as a lab snapshot records it ([`Bridge::record`]) and putting
//! that record back ([`Bridge::apply_record`]): attachments, partitions,
//! isolation, impairments and routes. A VM's own NICs are recorded with the
//! VM (`super::ports`).

use super::bridge::{Bridge, NetMember};
use super::error::NetworkError;

impl Bridge {
    /// This bridge as a lab snapshot records it (`lab_path`: where it sits
    /// below the snapshotted lab): attachments, partitions, isolation,
    /// impairments and routes.
    pub fn record(&self, lab_path: &[String]) -> provium_snapshot::LabBridge {
        use provium_snapshot::{LabImpairment, LabPairImpairment};
        let sw = self.switch();
        let imp = |i: &provium_netsetup::Impairment| LabImpairment {
            latency_ns: i
                .latency
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            drop_pct: i.drop_pct,
            bandwidth_bps: i.bandwidth_bps,
        };
        let whole = provium_netsetup::Impairment {
            latency: sw.latency(),
            drop_pct: sw.drop_rate_pct(),
            bandwidth_bps: sw.bandwidth_bps(),
        };
        provium_snapshot::LabBridge {
            lab_path: lab_path.to_vec(),
            name: self.name().to_owned(),
            members: self.members_sorted(),
            partitions: sw.partitions(),
            isolated: sw.isolated(),
            impairment: imp(&whole),
            pair_impairments: sw
                .pair_impairments()
                .into_iter()
                .map(|((from, to), i)| LabPairImpairment {
                    from,
                    to,
                    impairment: imp(&i),
                })
                .collect(),
            routes: self.routes(),
        }
    }

    /// Puts a recorded bridge's graph state back: recorded attachments this
    /// bridge lacks come back as bare names (a recorded VM joins through
    /// its own restore), and partitions, isolation, impairments and routes
    /// become exactly the recorded ones.
    pub fn apply_record(
        &self,
        rec: &provium_snapshot::LabBridge,
        vm_names: &[String],
    ) -> Result<(), NetworkError> {
        let to_imp = |i: &provium_snapshot::LabImpairment| provium_netsetup::Impairment {
            latency: i.latency_ns.map(std::time::Duration::from_nanos),
            drop_pct: i.drop_pct,
            bandwidth_bps: i.bandwidth_bps,
        };
        let missing: Vec<(String, Option<NetMember>)> = {
            let st = self.open_state("restore")?;
            rec.members
                .iter()
                .filter(|m| !st.members.contains_key(*m) && !vm_names.contains(m))
                .map(|m| (m.clone(), None))
                .collect()
        };
        if !missing.is_empty() {
            self.attach_all(missing)?;
        }
        let sw = self.switch();
        // reset(): no impairment, no partition (isolation is kept).
        sw.reset();
        let whole = to_imp(&rec.impairment);
        sw.set_latency(whole.latency.unwrap_or_default());
        sw.set_drop_rate(whole.drop_pct.unwrap_or(0.0))
            .map_err(NetworkError::DropRate)?;
        sw.set_bandwidth(whole.bandwidth_bps.unwrap_or(0));
        for p in &rec.pair_impairments {
            let i = to_imp(&p.impairment);
            if let Some(l) = i.latency {
                sw.set_pair_latency(&p.from, &p.to, l);
            }
            if let Some(d) = i.drop_pct {
                sw.set_pair_drop_rate(&p.from, &p.to, d).map_err(|source| {
                    NetworkError::PairDropRate {
                        from: p.from.clone(),
                        to: p.to.clone(),
                        source,
                    }
                })?;
            }
            if let Some(b) = i.bandwidth_bps {
                sw.set_pair_bandwidth(&p.from, &p.to, b);
            }
        }
        // Symmetric inserts need no attached ports; then drop the reverse
        // directions that were not recorded.
        for (a, b) in &rec.partitions {
            sw.partition(a, b);
        }
        for (a, b) in &rec.partitions {
            if !rec.partitions.contains(&(b.clone(), a.clone())) {
                sw.unpartition_directional(b, a);
            }
        }
        for n in sw.isolated() {
            if !rec.isolated.contains(&n) {
                sw.unisolate(&n);
            }
        }
        for n in &rec.isolated {
            sw.isolate(n);
        }
        self.set_routes(rec.routes.clone());
        Ok(())
    }
}
