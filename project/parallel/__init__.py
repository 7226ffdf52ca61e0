"""In-rank: strategies, samplers, collectives, stops and failures; the layout is the pure ``project.plan``'s."""
