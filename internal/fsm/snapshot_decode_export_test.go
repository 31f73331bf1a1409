package fsm

// RestoreWhole restores b the way RestoreBytes did before it decoded the
// locks one at a time: the whole snapshot unmarshalled into messages, then
// Load. FuzzRestore checks both ways accept the same snapshots and build
// the same state.
func (f *FSM) RestoreWhole(b []byte) error {
	snap, err := unmarshalSnapshot(b)
	if err != nil {
		return err
	}
	return f.Load(snap)
}
