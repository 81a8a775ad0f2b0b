"""Kineto traces read and merged: each rank's file found, streamed, loaded and aligned, and the merged trace written."""
