package lease

// The heap of entries by when, with each entry's index kept current so
// Removed takes O(log n). Written out instead of container/heap: no
// interface calls on the leader's hot path, and the code is short.

func (m *Manager) less(i, j int) bool { return m.heap[i].when.Before(m.heap[j].when) }

func (m *Manager) swap(i, j int) {
	h := m.heap
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (m *Manager) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !m.less(j, i) {
			return
		}
		m.swap(i, j)
		j = i
	}
}

// down sifts the entry at i towards the leaves; it reports whether it moved.
func (m *Manager) down(i int) bool {
	i0, n := i, len(m.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && m.less(r, l) {
			j = r
		}
		if !m.less(j, i) {
			break
		}
		m.swap(i, j)
		i = j
	}
	return i > i0
}

func (m *Manager) push(e *entry) {
	e.index = len(m.heap)
	m.heap = append(m.heap, e)
	m.up(e.index)
}

// removeAt takes the entry at i out of the heap.
func (m *Manager) removeAt(i int) {
	n := len(m.heap) - 1
	e := m.heap[i]
	if i != n {
		m.swap(i, n)
	}
	m.heap[n] = nil
	m.heap = m.heap[:n]
	if i != n && !m.down(i) {
		m.up(i)
	}
	e.index = -1
}
