"""The reference for the idle-footprint benchmark: the polling loop of Microsoft's Python sample for
Scheduled Events, without its interactive menu.

The sample uses ``requests``, sleeps one second, GETs the document with ``Metadata: true`` and
``api-version=2020-07-01``, and compares ``DocumentIncarnation`` with the last one it processed; on a new
incarnation it walks the events (logging Started ones, approving User-initiated ones and Freezes shorter
than 9 s). That is all it does, so it is the floor against which the agent's idle cost is compared.

    .venv/bin/python bench/ms_sample.py http://127.0.0.1:PORT
"""

from __future__ import annotations

import json
import sys
from time import sleep

import requests


def main(base_url: str) -> None:
    metadata_url = base_url.rstrip("/") + "/metadata/scheduledevents"
    header = {"Metadata": "true"}
    query_params = {"api-version": "2020-07-01"}
    last_document_incarnation = -1
    while True:
        sleep(1)
        payload = requests.get(metadata_url, headers=header, params=query_params, timeout=10).json()
        found_document_incarnation = payload["DocumentIncarnation"]
        if found_document_incarnation == last_document_incarnation:
            continue
        for event in payload["Events"]:
            if event["EventStatus"] == "Started":
                print(event.get("Description", event["EventId"]), flush=True)
            elif event.get("EventSource") == "User" or (
                event["EventType"] == "Freeze" and 0 <= int(event.get("DurationInSeconds", -1)) < 9
            ):
                requests.post(metadata_url, headers=header, params=query_params, timeout=10,
                              data=json.dumps({"StartRequests": [{"EventId": event["EventId"]}]}))
        last_document_incarnation = found_document_incarnation


if __name__ == "__main__":
    main(sys.argv[1])
