#!/bin/sh
# Makes the test recordings: English sentences spoken by espeak-ng, 16 kHz mono 16-bit wav (apt-get install -y espeak-ng sox).
set -eu
cd "$(dirname "$0")"
say() {  # say NAME VOICE TEXT
    espeak-ng -v "$2" -s 150 -w "$1.22k.wav" "$3"
    sox "$1.22k.wav" -r 16000 -c 1 -b 16 "$1.wav"
    rm "$1.22k.wav"
}
say fox en-us "The quick brown fox jumps over the lazy dog."
say kitchen en-gb "Please turn off the lights in the kitchen before you leave."
say library en-gb-x-rp "She borrowed three books from the library on Monday."
