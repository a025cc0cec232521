"""Recall with networking off (run inside `unshare --net`, only loopback up): a real redis-server, a
real Chroma server and the packaged embedder, 50 facts, paraphrased questions. Prints one JSON object
with what it found; tests/test_memory_acceptance.py judges it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from colony.blackboard import Blackboard, TagFilter, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import ColonySettings
from colony.memory.chroma_server import EmbeddedChroma
from colony.memory.scopes import MemoryScope
from colony.memory.service import MemoryService
from colony.memory.types import MemoryQuery, NewMemory

FACTS = [
    ("Priya's dog is a greyhound called Comet.", "pets"),
    ("The quarterly budget review happens every March in Lisbon.", "work"),
    ("Tomas is allergic to peanuts.", "health"),
    ("The backup server lives in rack 14 of the Frankfurt data centre.", "infra"),
    ("Lena plays the cello in a community orchestra.", "hobbies"),
    ("The office wifi password is tulip-42.", "infra"),
    ("Marco commutes by bicycle along the river.", "travel"),
    ("The team's standup meeting starts at 9:15.", "work"),
    ("Ines grew up on a vineyard near Porto.", "family"),
    ("The staging database is PostgreSQL 16.", "infra"),
]
FILLER_TOPICS = [
    "ordered new chairs for the meeting room",
    "renewed the domain name for two years",
    "painted the fence green last summer",
    "keeps a jar of sourdough starter in the fridge",
    "collects vintage postcards from Italy",
]
QUESTIONS = [  # paraphrases: no content word in common with the fact they ask about
    ("What breed of hound does Priya own?", 0),
    ("Which foods must Tomas avoid eating?", 2),
    ("Where is the machine holding our copies of data kept?", 3),
    ("Which instrument does Lena perform?", 4),
    ("How does Marco get to work?", 6),
]


def facts() -> list[tuple[str, str]]:
    out = list(FACTS)
    people = ["Ada", "Bo", "Cyd", "Dee", "Eli", "Fay", "Gus", "Hal"]
    for n in range(50 - len(FACTS)):
        out.append((f"{people[n % len(people)]} {FILLER_TOPICS[n % len(FILLER_TOPICS)]} (note {n}).", "misc"))
    return out


async def main(data_dir: Path) -> dict[str, object]:
    redis = EmbeddedRedis(data_dir / "redis").start()
    chroma = EmbeddedChroma(data_dir)
    info = chroma.start()
    settings = ColonySettings(data_dir=data_dir, memory={"chroma_url": info.url})
    client = create_redis(redis.url, settings.blackboard)
    try:
        service = MemoryService(Blackboard(client, "offline"), settings)
        scope = MemoryScope.agent_ltm_semantic("offline-agent")
        await service.store.write_many(
            scope, [NewMemory(content=text, tags={f"topic:{topic}"}) for text, topic in facts()]
        )
        retriever = await service.retriever()
        report: dict[str, object] = {"vector": retriever.vector is not None, "firsts": [], "dropped": None}
        for question, index in QUESTIONS:
            found = await service.recall(MemoryQuery(query=question, max_results=5), [scope])
            report["firsts"].append(  # type: ignore[union-attr]
                {
                    "question": question,
                    "want": FACTS[index][0],
                    "got": found[0].entry.content,
                    "relevance": found[0].relevance,
                }
            )
        strict = await service.recall(
            MemoryQuery(query="Which instrument does Lena perform?", min_relevance=0.3, max_results=50),
            [scope],
        )
        report["dropped"] = {"kept": [r.entry.content for r in strict], "of": len(facts())}
        tagged = await service.recall(
            MemoryQuery(
                query="Which instrument does Lena perform?", tag_filter=TagFilter(all_of={"topic:infra"})
            ),
            [scope],
        )
        report["tagged"] = [sorted(r.entry.tags) for r in tagged]
        return report
    finally:
        await client.aclose()
        chroma.stop()
        EmbeddedRedis(data_dir / "redis").stop()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
